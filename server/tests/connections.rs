//! What one local client can do to the server's connections: pipelining
//! requests without reading the replies, holding idle or half-sent
//! connections, opening more connections than the server has file
//! descriptors or than its connection cap. Real server process, real Unix
//! socket, raw frames written by hand.

mod support;

use serde_json::{Value, json};
use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};
use support::{TestServer, script};

/// One canonical frame.
fn frame(value: &Value) -> Vec<u8> {
    let mut bytes = protocol::canonicalize(value).expect("canonical");
    bytes.push(b'\n');
    bytes
}

fn hello(client_id: &str) -> Vec<u8> {
    frame(&json!({
        "schema": "pi-workflows.client.v1",
        "type": "hello",
        "role": "client",
        "clientId": client_id,
        "protocolVersion": 1,
        "packageVersion": env!("CARGO_PKG_VERSION"),
    }))
}

fn request(client_id: &str, request_id: &str, operation: &str, payload: Value) -> Value {
    json!({
        "schema": "pi-workflows.client.v1",
        "type": "request",
        "requestId": request_id,
        "clientId": client_id,
        "operation": operation,
        "payload": payload,
    })
}

/// A raw connection that sent its hello (the server hello is left unread).
fn greeted(server: &TestServer, client_id: &str) -> UnixStream {
    let mut stream = UnixStream::connect(server.socket()).expect("connect");
    stream.write_all(&hello(client_id)).expect("send the hello");
    stream
}

/// How reading a connection ended.
#[derive(Debug, PartialEq, Eq)]
enum End {
    /// The server closed it (end of stream or reset).
    Closed,
    /// Nothing more arrived within the read timeout and it stayed open.
    StillOpen,
}

/// Reads whole frames until the connection ends or stays silent for `silence`.
fn read_frames(stream: &UnixStream, silence: Duration) -> (Vec<Value>, End) {
    stream.set_read_timeout(Some(silence)).unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut frames = Vec::new();
    let mut line = Vec::new();
    loop {
        match reader.read_until(b'\n', &mut line) {
            Ok(0) => return (frames, End::Closed),
            Ok(_) if line.ends_with(b"\n") => {
                frames.push(serde_json::from_slice(&line).expect("a JSON frame"));
                line.clear();
            }
            // A partial last line means the stream ended.
            Ok(_) => return (frames, End::Closed),
            Err(error) if matches!(error.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return (frames, End::StillOpen);
            }
            Err(_) => return (frames, End::Closed),
        }
    }
}

/// The `<code>: <message>` reason of the server's closing error frame, if the
/// frames end with one.
fn closing_reason(frames: &[Value]) -> Option<String> {
    let last = frames.last()?;
    (last["type"] == "event"
        && last["subscriptionId"] == "connection"
        && last["event"]["kind"] == "availability"
        && last["event"]["state"] == "unavailable")
        .then(|| {
            last["event"]["reason"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
}

/// One `server.status` round trip on a new connection, bounded by `limit`.
fn status_round_trip(server: &TestServer, limit: Duration) -> Result<Duration, String> {
    let started = Instant::now();
    let client_id = format!("probe-{}", server::ids::random_hex::<4>());
    let request_id = format!("status-{}", server::ids::random_hex::<6>());
    let mut stream =
        UnixStream::connect(server.socket()).map_err(|error| format!("connect: {error}"))?;
    stream.set_read_timeout(Some(limit)).unwrap();
    stream.set_write_timeout(Some(limit)).unwrap();
    stream
        .write_all(&hello(&client_id))
        .and_then(|()| {
            stream.write_all(&frame(&request(
                &client_id,
                &request_id,
                "server.status",
                json!({}),
            )))
        })
        .map_err(|error| format!("write: {error}"))?;
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    loop {
        line.clear();
        match reader.read_line(&mut line) {
            Ok(0) => return Err(format!("closed before the answer: {line}")),
            Ok(_) => {
                let value: Value = serde_json::from_str(&line).map_err(|_| line.clone())?;
                if value["requestId"] == request_id.as_str() {
                    return Ok(started.elapsed());
                }
                if value["type"] == "event" {
                    return Err(format!("refused: {}", value["event"]["reason"]));
                }
            }
            Err(error) => return Err(format!("no answer within {limit:?}: {error}")),
        }
    }
}

/// The server's resident memory in KiB (`VmRSS` of /proc/PID/status).
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

/// CPU time (user + system) the process used so far.
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("proc stat");
    // Fields after the command name: state is the first, utime the 12th, stime the 13th.
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    let per_second: u64 = String::from_utf8(
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .expect("getconf")
            .stdout,
    )
    .unwrap()
    .trim()
    .parse()
    .unwrap();
    Duration::from_millis(ticks * 1000 / per_second)
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(Iterator::count)
        .unwrap_or(0)
}

/// The memory bound for one connection that pipelines without reading:
/// what the server may grow by over its idle size.
const PIPELINE_GROWTH_BOUND_KIB: u64 = 64 * 1024;

#[test]
fn a_client_that_pipelines_requests_without_reading_stays_bounded_and_is_closed() {
    let server = TestServer::start_with(&[("PI_WORKFLOWS_STALLED_CLIENT_MS", "1000")]);
    let pid = server.pid();
    // Let the server settle, then take its idle size.
    assert!(status_round_trip(&server, Duration::from_secs(10)).is_ok());
    let baseline = rss_kib(pid);
    let stream = greeted(&server, "pipeliner");
    let requests: Vec<u8> = (0..50_000)
        .flat_map(|i| {
            frame(&request(
                "pipeliner",
                &format!("p-{i}"),
                "server.status",
                json!({}),
            ))
        })
        .collect();
    let mut writing = stream.try_clone().unwrap();
    let writer = std::thread::spawn(move || writing.write_all(&requests).is_ok());
    // While the client does not read, sample the server's memory and check
    // that other clients are still answered.
    let observe_until = Instant::now() + Duration::from_secs(4);
    let mut peak = baseline;
    let mut others = Vec::new();
    while Instant::now() < observe_until {
        peak = peak.max(rss_kib(pid));
        others.push(status_round_trip(&server, Duration::from_secs(10)));
        peak = peak.max(rss_kib(pid));
        std::thread::sleep(Duration::from_millis(200));
    }
    // Now read what the server wrote: it should have closed the connection.
    let (frames, end) = read_frames(&stream, Duration::from_secs(20));
    peak = peak.max(rss_kib(pid));
    let all_written = writer.join().unwrap();
    let responses = frames.iter().filter(|f| f["type"] == "response").count();
    eprintln!(
        "server RSS {baseline} KiB idle, {peak} KiB at most; {responses} responses before the close"
    );
    let mut problems = Vec::new();
    if peak > baseline + PIPELINE_GROWTH_BOUND_KIB {
        problems.push(format!(
            "server RSS grew from {baseline} KiB to {peak} KiB (bound: +{PIPELINE_GROWTH_BOUND_KIB} KiB)"
        ));
    }
    if end != End::Closed {
        problems.push(format!(
            "the connection was not closed (it stayed open after {responses} responses; all 50000 requests written: {all_written})"
        ));
    }
    let reason = closing_reason(&frames);
    if !reason
        .as_deref()
        .is_some_and(|reason| reason.starts_with("rateLimited: "))
    {
        problems.push(format!(
            "the connection did not end with a rateLimited error frame (last frame: {:?})",
            frames.last()
        ));
    }
    let failed: Vec<&String> = others
        .iter()
        .filter_map(|other| other.as_ref().err())
        .collect();
    if !failed.is_empty() || others.is_empty() {
        problems.push(format!(
            "other clients were not answered: {failed:?} of {}",
            others.len()
        ));
    }
    assert!(problems.is_empty(), "{problems:#?}");
    assert!(
        responses < 50_000,
        "the server stopped answering before the end of the pipeline"
    );
    // The server is healthy afterwards and the connection is gone.
    assert!(status_round_trip(&server, Duration::from_secs(10)).is_ok());
}

#[test]
fn commands_accepted_before_a_stalled_connection_is_closed_still_store_their_receipts() {
    let server = TestServer::start_with(&[("PI_WORKFLOWS_STALLED_CLIENT_MS", "1000")]);
    let linear = script("linear.json");
    let command = |i: usize| {
        let mut value = request(
            "stalled-commands",
            &format!("start-{i}"),
            "run.start",
            json!({ "workflow": linear.to_string_lossy(), "input": {"i": i}, "executionMode": "headless", "projectPath": "/tmp" }),
        );
        value["idempotencyKey"] = json!(format!("stalled-key-{i}"));
        value
    };
    const COMMANDS: usize = 24;
    let mut bytes: Vec<u8> = (0..COMMANDS).flat_map(|i| frame(&command(i))).collect();
    // Enough unread replies behind the commands to fill the socket.
    bytes.extend((0..50_000).flat_map(|i| {
        frame(&request(
            "stalled-commands",
            &format!("fill-{i}"),
            "server.status",
            json!({}),
        ))
    }));
    let stream = greeted(&server, "stalled-commands");
    let mut writing = stream.try_clone().unwrap();
    let writer = std::thread::spawn(move || {
        let _ = writing.write_all(&bytes);
    });
    std::thread::sleep(Duration::from_secs(3));
    let (_, end) = read_frames(&stream, Duration::from_secs(20));
    assert_eq!(end, End::Closed, "the stalled connection was closed");
    writer.join().unwrap();
    // Every command the server read ran to its receipt: an exact retry of
    // each on a new connection adopts it or (never read) starts it now, and
    // there is exactly one run per command.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let mut client =
            pi_workflows_client::Connection::connect(&server.socket(), "stalled-commands")
                .await
                .unwrap();
        let mut adopted = 0;
        for i in 0..COMMANDS {
            let mut spec = pi_workflows_client::RequestSpec::command(
                "run.start",
                None,
                command(i)["payload"].clone(),
            );
            spec.idempotency_key = Some(format!("stalled-key-{i}"));
            let response = client.request(&spec).await.unwrap();
            assert!(
                ["accepted", "adopted"].contains(&response.outcome.as_str()),
                "{:?}",
                response.frame
            );
            adopted += usize::from(response.outcome == "adopted");
        }
        // All commands came before the unread replies, so the server read
        // (and answered durably) every one of them before it closed.
        assert_eq!(
            adopted, COMMANDS,
            "every command read before the close kept its receipt"
        );
    });
    let runs = support::count(&server.db(), "SELECT COUNT(*) FROM runs", []);
    assert_eq!(runs, COMMANDS as i64, "one run per command");
}

#[test]
fn a_half_sent_frame_and_a_silent_connection_are_closed_after_the_frame_timeout() {
    let server = TestServer::start_with(&[("PI_WORKFLOWS_FRAME_TIMEOUT_MS", "1000")]);
    // A slow loris: a greeted connection trickles a request, one byte every
    // 200 ms, never reaching its newline.
    let loris = greeted(&server, "loris");
    let trickle = {
        let mut writing = loris.try_clone().unwrap();
        std::thread::spawn(move || {
            for byte in b"{\"clientId\":\"loris\",\"operation\":\"server.status\"".repeat(4) {
                if writing.write_all(&[byte]).is_err() {
                    return true;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            false
        })
    };
    // A connection that never says hello.
    let silent = UnixStream::connect(server.socket()).unwrap();
    let started = Instant::now();
    let (loris_frames, loris_end) = read_frames(&loris, Duration::from_secs(8));
    let (silent_frames, silent_end) = read_frames(&silent, Duration::from_secs(8));
    let mut problems = Vec::new();
    if loris_end != End::Closed {
        problems.push(format!(
            "the half-sent frame was still open after {:?}",
            started.elapsed()
        ));
    }
    if !closing_reason(&loris_frames).is_some_and(|reason| reason.starts_with("timedOut: ")) {
        problems.push(format!(
            "the half-sent frame got no timedOut frame: {:?}",
            loris_frames.last()
        ));
    }
    if silent_end != End::Closed {
        problems.push("the connection without a hello was still open".into());
    }
    if !closing_reason(&silent_frames).is_some_and(|reason| reason.starts_with("timedOut: ")) {
        problems.push(format!(
            "the connection without a hello got no timedOut frame: {:?}",
            silent_frames.last()
        ));
    }
    assert!(problems.is_empty(), "{problems:#?}");
    assert!(
        trickle.join().unwrap(),
        "the trickling writer saw the close"
    );
    assert!(status_round_trip(&server, Duration::from_secs(10)).is_ok());
}

#[test]
fn an_idle_connection_is_closed_after_its_limit_but_a_subscribed_or_busy_one_is_not() {
    let mut server = TestServer::new(&[("PI_WORKFLOWS_CONNECTION_IDLE_MS", "1000")]);
    server.spawn().unwrap();
    let slow = support::write_script(
        server.scratch(),
        "slow-resolve.json",
        &json!({ "topology": support::linear_topology(&["a"]), "resolveDelayMs": 3000 }),
    );
    let idle = greeted(&server, "idle");
    let mut subscribed = greeted(&server, "subscribed");
    subscribed
        .write_all(&frame(&request(
            "subscribed",
            "sub-1",
            "subscribe",
            json!({ "target": { "kind": "runList" } }),
        )))
        .unwrap();
    // A command that takes longer than the idle limit (its resolve waits 3 s).
    let mut busy = greeted(&server, "busy");
    let mut start = request(
        "busy",
        "busy-start",
        "run.start",
        json!({ "workflow": slow.to_string_lossy(), "input": {}, "executionMode": "headless", "projectPath": "/tmp" }),
    );
    start["idempotencyKey"] = json!("busy-key");
    busy.write_all(&frame(&start)).unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    let (idle_frames, idle_end) = read_frames(&idle, Duration::from_secs(5));
    let mut problems = Vec::new();
    if idle_end != End::Closed {
        problems.push("the idle connection was still open".to_owned());
    }
    if !closing_reason(&idle_frames).is_some_and(|reason| reason.starts_with("timedOut: ")) {
        problems.push(format!(
            "the idle connection got no timedOut frame: {:?}",
            idle_frames.last()
        ));
    }
    // The busy connection gets its answer, after the idle limit passed.
    let (busy_frames, _) = read_frames(&busy, Duration::from_secs(5));
    if !busy_frames
        .iter()
        .any(|f| f["requestId"] == "busy-start" && f["outcome"] == "accepted")
    {
        problems.push(format!(
            "the connection with a command in flight lost its answer: {busy_frames:?}"
        ));
    }
    // The subscribed connection still answers, well past the idle limit.
    subscribed
        .write_all(&frame(&request(
            "subscribed",
            "sub-status",
            "server.status",
            json!({}),
        )))
        .unwrap();
    let (subscribed_frames, _) = read_frames(&subscribed, Duration::from_secs(2));
    if !subscribed_frames
        .iter()
        .any(|f| f["requestId"] == "sub-status" && f["outcome"] == "accepted")
    {
        problems.push(format!(
            "the subscribed connection was closed: {:?}",
            subscribed_frames.last()
        ));
    }
    assert!(problems.is_empty(), "{problems:#?}");
}

#[test]
fn at_a_low_descriptor_limit_the_server_does_not_spin_and_recovers_when_connections_close() {
    let server = TestServer::start();
    let pid = server.pid();
    // Lower the running server's descriptor limit to 64 (like `ulimit -n 64`).
    let status = std::process::Command::new("prlimit")
        .args([format!("--pid={pid}"), "--nofile=64:64".to_owned()])
        .status()
        .expect("run prlimit (util-linux)");
    assert!(status.success());
    // More connections than the server has descriptors left.
    let mut connections = Vec::new();
    for i in 0..120 {
        match UnixStream::connect(server.socket()) {
            Ok(mut stream) => {
                let _ = stream.write_all(&hello(&format!("hold-{i}")));
                connections.push(stream);
            }
            Err(_) => break,
        }
    }
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        open_fds(pid) >= 60,
        "the server reached its descriptor limit ({} open)",
        open_fds(pid)
    );
    let before = cpu_time(pid);
    let window = Duration::from_secs(3);
    std::thread::sleep(window);
    let used = cpu_time(pid) - before;
    let pending = connections.len();
    eprintln!(
        "{pending} connections, {} descriptors open: {used:?} of CPU in {window:?}",
        open_fds(pid)
    );
    drop(connections);
    assert!(
        used < window / 4,
        "the server used {used:?} of CPU in {window:?} with {pending} connections at its descriptor limit"
    );
    // Once the connections closed, the server answers again.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match status_round_trip(&server, Duration::from_secs(5)) {
            Ok(_) => break,
            Err(error) => assert!(
                Instant::now() < deadline,
                "no answer after the connections closed: {error}"
            ),
        }
    }
}

#[test]
fn a_connection_over_the_cap_is_refused_with_a_frame_that_says_why() {
    let server = TestServer::start_with(&[("PI_WORKFLOWS_MAX_CONNECTIONS", "3")]);
    let held: Vec<UnixStream> = (0..3)
        .map(|i| greeted(&server, &format!("held-{i}")))
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    // The server may refuse (and close) before the hello is written.
    let mut extra = UnixStream::connect(server.socket()).unwrap();
    let _ = extra.write_all(&hello("extra"));
    let (frames, end) = read_frames(&extra, Duration::from_secs(5));
    let reason = closing_reason(&frames);
    assert!(
        end == End::Closed
            && reason
                .as_deref()
                .is_some_and(|reason| reason.starts_with("unavailable: ")
                    && reason.contains("too many connections")),
        "over the cap: {end:?}, {frames:?}"
    );
    // The refusal is the only frame (no hello): a client cannot mistake it for a session.
    assert_eq!(frames.len(), 1, "{frames:?}");
    // The CLI says so in one line.
    let output = server
        .command()
        .args(["server", "status"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(5), "{stderr}");
    assert!(stderr.contains("too many connections"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    // A freed slot is usable again.
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(10);
    while let Err(error) = status_round_trip(&server, Duration::from_secs(5)) {
        assert!(Instant::now() < deadline, "{error}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_holds_at_most_64_subscriptions() {
    let server = TestServer::start();
    let mut client = server.client().await;
    for i in 0..64 {
        let response = client
            .subscribe(json!({ "kind": "runList" }), None)
            .await
            .unwrap();
        assert_eq!(response.outcome, "accepted", "subscription {i}");
    }
    let over = client
        .subscribe(json!({ "kind": "runList" }), None)
        .await
        .unwrap();
    assert_eq!(
        (over.outcome.as_str(), over.error_code.as_deref()),
        ("rejected", Some("rateLimited")),
        "{:?}",
        over.frame
    );
    assert!(
        over.error_message
            .as_deref()
            .is_some_and(|message| message.contains("unsubscribe one first")),
        "{:?}",
        over.frame
    );
    // Another connection is not limited by this one.
    let mut other = server.client().await;
    let response = other
        .subscribe(json!({ "kind": "runList" }), None)
        .await
        .unwrap();
    assert_eq!(response.outcome, "accepted");
}
