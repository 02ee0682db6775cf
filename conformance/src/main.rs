//! `conformance-rs`: runs the shared fixture corpus (layout in
//! `protocol/fixtures/README.md`) against the Rust `protocol` crate.
//!
//! Usage: `conformance-rs [--fixtures DIR] [--emit-verdicts FILE]`.
//! Prints one line per failing case and a final `N passed, N failed`;
//! exits non-zero on any failure. `--emit-verdicts` writes one line per
//! case (verdict, kind or error code, SHA-256 of the re-encoded bytes) for
//! comparison with the TypeScript runner.
//!
//! `conformance-rs --decide` reads inputs from stdin instead, one per line
//! as `CHANNEL<TAB>HEX` (a channel of the corpus, or `canonical` for
//! `parse_canonical` alone), and prints the verdict of each, in order, in
//! the same form (`accept<TAB>kind<TAB>sha256` or `reject<TAB>code`): the
//! TypeScript fuzz comparison (`sdk-ts/tools/fuzz-parity.test.ts`) feeds it
//! generated inputs.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use protocol::{FrameDecoder, SafeError};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// SHA-256 of the first 100,000 lines of the ES6 number corpus.
const ES6_100K_SHA256: &str = "22776e6d4b49fa294a0d0f349268e5c28808fe7e0cb2bcbe28f63894e494d4c7";
const JCS_FILES: [&str; 6] = [
    "arrays",
    "french",
    "structures",
    "unicode",
    "values",
    "weird",
];

/// Decodes one input and re-encodes it: `(kind, encoded bytes)`.
type Decode = dyn Fn(&[u8]) -> Result<(String, Vec<u8>), SafeError>;

/// What the implementation did with one input.
enum Outcome {
    /// Accepted: the message kind and the re-encoded bytes.
    Accept { kind: String, encoded: Vec<u8> },
    /// Rejected with this code.
    Reject(String),
}

struct Report {
    passed: usize,
    failed: usize,
    verdicts: String,
}

impl Report {
    fn record(&mut self, case: &str, failure: Option<String>, verdict: String) {
        let _ = writeln!(self.verdicts, "{case}\t{verdict}");
        match failure {
            None => self.passed += 1,
            Some(why) => {
                self.failed += 1;
                println!("FAIL {case}: {why}");
            }
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

fn code(e: SafeError) -> String {
    e.code().to_string()
}

fn run_frames(channel: &str, input: &[u8]) -> Outcome {
    let single = |f: &Decode, bytes: &[u8]| match f(bytes) {
        Ok((kind, encoded)) => Outcome::Accept { kind, encoded },
        Err(e) => Outcome::Reject(code(e)),
    };
    match channel {
        "launch" => single(
            &|b| {
                let m = protocol::decode_launch(b)?;
                Ok((protocol::launch_kind(&m), protocol::encode_launch(&m)?))
            },
            input,
        ),
        "canonical" => single(
            &|b| {
                let v = protocol::parse_canonical(b)?;
                Ok(("canonical".to_string(), protocol::canonicalize(&v)?))
            },
            input,
        ),
        "run-view" => single(
            &|b| {
                let v = protocol::decode_run_view(b)?;
                Ok(("run-view".to_string(), protocol::canonicalize_typed(&v)?))
            },
            input,
        ),
        _ => {
            let mut decoder = FrameDecoder::new();
            decoder.push(input);
            let mut frames = Vec::new();
            loop {
                match decoder.next_frame() {
                    Ok(Some(frame)) => frames.push(frame),
                    Ok(None) => break,
                    Err(e) => return Outcome::Reject(code(e)),
                }
            }
            if let Err(e) = decoder.finish() {
                return Outcome::Reject(code(e));
            }
            if frames.len() != 1 {
                return Outcome::Reject(format!(
                    "corpus error: {} frames in one case",
                    frames.len()
                ));
            }
            let decode: &Decode = match channel {
                "client" => &|b| {
                    let f = protocol::decode_client_frame(b)?;
                    Ok((f.kind(), protocol::encode_client(&f.message)?))
                },
                "runner" => &|b| {
                    let m = protocol::decode_runner_frame(b)?;
                    Ok((protocol::runner_kind(&m), protocol::encode_runner(&m)?))
                },
                "server" => &|b| {
                    let m = protocol::decode_server_frame(b)?;
                    Ok((protocol::server_kind(&m), protocol::encode_server(&m)?))
                },
                other => return Outcome::Reject(format!("corpus error: unknown channel {other}")),
            };
            single(decode, &frames[0])
        }
    }
}

fn verdict_line(outcome: Outcome) -> String {
    match outcome {
        Outcome::Accept { kind, encoded } => {
            format!("accept\t{kind}\t{}", hex(&Sha256::digest(&encoded)))
        }
        Outcome::Reject(code) => format!("reject\t{code}"),
    }
}

/// `--decide`: one verdict line per `CHANNEL<TAB>HEX` line of stdin.
fn decide_stdin() -> ExitCode {
    let mut out = String::new();
    for (n, line) in std::io::stdin().lines().enumerate() {
        let Ok(line) = line else {
            eprintln!("conformance-rs: stdin is not UTF-8 text");
            return ExitCode::from(2);
        };
        let parsed = line.split_once('\t').and_then(|(channel, hex)| {
            let bytes = (0..hex.len())
                .step_by(2)
                .map(|i| {
                    hex.get(i..i + 2)
                        .and_then(|h| u8::from_str_radix(h, 16).ok())
                })
                .collect::<Option<Vec<u8>>>()?;
            Some((channel, bytes))
        });
        let Some((channel, bytes)) = parsed else {
            eprintln!("conformance-rs: line {}: expected CHANNEL<TAB>HEX", n + 1);
            return ExitCode::from(2);
        };
        let _ = writeln!(out, "{}", verdict_line(run_frames(channel, &bytes)));
    }
    print!("{out}");
    ExitCode::SUCCESS
}

fn frame_cases(dir: &Path, report: &mut Report) -> Result<(), String> {
    let frames = dir.join("frames");
    let mut channels: Vec<PathBuf> = std::fs::read_dir(&frames)
        .map_err(|e| format!("{}: {e}", frames.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .collect();
    channels.sort();
    for channel_dir in channels {
        let channel = channel_dir
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_string();
        let mut inputs: Vec<PathBuf> = std::fs::read_dir(&channel_dir)
            .map_err(|e| format!("{}: {e}", channel_dir.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "in"))
            .collect();
        inputs.sort();
        for input_path in inputs {
            let name = input_path
                .file_stem()
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            let case = format!("{channel}/{name}");
            let input = std::fs::read(&input_path).map_err(|e| format!("{case}: {e}"))?;
            let expect: Value = std::fs::read(channel_dir.join(format!("{name}.expect.json")))
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok())
                .ok_or_else(|| format!("{case}: missing or invalid .expect.json"))?;
            let want_verdict = expect["verdict"].as_str().unwrap_or_default();
            let (failure, verdict) = match (run_frames(&channel, &input), want_verdict) {
                (Outcome::Accept { kind, encoded }, "accept") => {
                    let want_kind = expect["kind"].as_str().unwrap_or_default();
                    let canonical = std::fs::read(channel_dir.join(format!("{name}.canonical")))
                        .unwrap_or_default();
                    let failure = if kind != want_kind {
                        Some(format!("kind {kind}, expected {want_kind}"))
                    } else if encoded != canonical {
                        Some("re-encoded bytes differ from .canonical".to_string())
                    } else {
                        None
                    };
                    (
                        failure,
                        format!("accept\t{kind}\t{}", hex(&Sha256::digest(&encoded))),
                    )
                }
                (Outcome::Accept { kind, encoded }, _) => (
                    Some(format!(
                        "accepted as {kind}, expected reject {}",
                        expect["error"]
                    )),
                    format!("accept\t{kind}\t{}", hex(&Sha256::digest(&encoded))),
                ),
                (Outcome::Reject(got), "reject") => {
                    let want = expect["error"].as_str().unwrap_or_default();
                    let failure =
                        (got != want).then(|| format!("rejected with {got}, expected {want}"));
                    (failure, format!("reject\t{got}"))
                }
                (Outcome::Reject(got), _) => (
                    Some(format!("rejected with {got}, expected accept")),
                    format!("reject\t{got}"),
                ),
            };
            report.record(&case, failure, verdict);
        }
    }
    Ok(())
}

fn parse_hex(text: &str) -> Option<Vec<u8>> {
    text.split_whitespace()
        .map(|h| u8::from_str_radix(h, 16).ok())
        .collect()
}

fn jcs_cases(dir: &Path, report: &mut Report) -> Result<(), String> {
    let jcs = dir.join("jcs");
    for name in JCS_FILES {
        let case = format!("jcs/{name}");
        let read =
            |sub: &str, ext: &str| std::fs::read(jcs.join(sub).join(format!("{name}.{ext}")));
        let (input, output, outhex) = match (
            read("input", "json"),
            read("output", "json"),
            read("outhex", "txt"),
        ) {
            (Ok(i), Ok(o), Ok(h)) => (i, o, h),
            _ => return Err(format!("{case}: missing vector files")),
        };
        let got = serde_json::from_slice::<Value>(&input)
            .map_err(|_| "input does not parse".to_string())
            .and_then(|v| protocol::canonicalize(&v).map_err(|e| e.to_string()));
        let expected_hex = parse_hex(&String::from_utf8_lossy(&outhex));
        let failure = match &got {
            Err(e) => Some(e.clone()),
            Ok(_) if expected_hex.as_deref() != Some(output.as_slice()) => {
                Some("output and outhex disagree".into())
            }
            Ok(bytes) if *bytes != output => Some("canonical bytes differ from output".into()),
            Ok(_) => None,
        };
        let digest = got.map(|b| hex(&Sha256::digest(&b))).unwrap_or_default();
        report.record(&case, failure, format!("pass\t{digest}"));
    }
    let case = "jcs/es6-numbers-100k";
    let data =
        std::fs::read(jcs.join("es6-numbers-100k.txt")).map_err(|e| format!("{case}: {e}"))?;
    let digest = hex(&Sha256::digest(&data));
    let mut lines = 0usize;
    let mut bad = 0usize;
    let mut first_bad = None;
    for line in String::from_utf8_lossy(&data).lines() {
        lines += 1;
        let Some((bits, expected)) = line.split_once(',') else {
            bad += 1;
            continue;
        };
        let got = u64::from_str_radix(bits, 16)
            .ok()
            .map(f64::from_bits)
            .and_then(serde_json::Number::from_f64)
            .and_then(|n| protocol::canonicalize(&Value::Number(n)).ok());
        if got.as_deref() != Some(expected.as_bytes()) {
            bad += 1;
            first_bad.get_or_insert_with(|| {
                format!(
                    "{bits}: got {:?}, expected {expected}",
                    got.map(|g| String::from_utf8_lossy(&g).into_owned())
                )
            });
        }
    }
    let failure = if digest != ES6_100K_SHA256 {
        Some(format!(
            "corpus SHA-256 {digest}, expected {ES6_100K_SHA256}"
        ))
    } else if lines != 100_000 || bad != 0 {
        Some(format!(
            "{bad} of {lines} lines wrong; first: {}",
            first_bad.unwrap_or_default()
        ))
    } else {
        None
    };
    report.record(case, failure, format!("pass\t{lines}"));
    Ok(())
}

fn main() -> ExitCode {
    let mut fixtures = PathBuf::from("protocol/fixtures");
    let mut emit: Option<PathBuf> = None;
    let mut args = std::env::args().skip(1).peekable();
    if args.peek().map(String::as_str) == Some("--decide") {
        return decide_stdin();
    }
    while let Some(arg) = args.next() {
        match (arg.as_str(), args.next()) {
            ("--fixtures", Some(v)) => fixtures = PathBuf::from(v),
            ("--emit-verdicts", Some(v)) => emit = Some(PathBuf::from(v)),
            _ => {
                eprintln!("usage: conformance-rs [--fixtures DIR] [--emit-verdicts FILE]");
                return ExitCode::from(2);
            }
        }
    }
    let mut report = Report {
        passed: 0,
        failed: 0,
        verdicts: String::new(),
    };
    for run in [frame_cases, jcs_cases] {
        if let Err(e) = run(&fixtures, &mut report) {
            eprintln!("conformance-rs: {e}");
            return ExitCode::from(2);
        }
    }
    if let Some((path, Err(e))) = emit.map(|p| {
        let r = std::fs::write(&p, &report.verdicts);
        (p, r)
    }) {
        eprintln!("conformance-rs: {}: {e}", path.display());
        return ExitCode::from(2);
    }
    println!("{} passed, {} failed", report.passed, report.failed);
    if report.failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
