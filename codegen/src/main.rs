//! `cargo run -p codegen` writes every generated file;
//! `cargo run -p codegen -- --check` exits non-zero when a checked-in
//! generated file differs from what the schemas produce.

use std::process::ExitCode;

fn main() -> ExitCode {
    let check = match std::env::args().nth(1).as_deref() {
        None => false,
        Some("--check") => true,
        Some(other) => {
            eprintln!("usage: codegen [--check] (unknown argument {other})");
            return ExitCode::from(2);
        }
    };
    let root = codegen::repo_root();
    let outputs = match codegen::generate(&root) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("codegen: {e}");
            return ExitCode::FAILURE;
        }
    };
    let stale = codegen::stale(&root, &outputs);
    if check {
        for path in &stale {
            eprintln!("stale generated file: {}", path.display());
        }
        if stale.is_empty() {
            println!(
                "codegen --check: {} generated files are up to date",
                outputs.len()
            );
            return ExitCode::SUCCESS;
        }
        eprintln!("run `cargo run -p codegen` and commit the result");
        return ExitCode::FAILURE;
    }
    for o in &outputs {
        let path = root.join(&o.path);
        if let Some(Err(e)) = path.parent().map(std::fs::create_dir_all) {
            eprintln!("codegen: {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
        if stale.contains(&o.path) {
            if let Err(e) = std::fs::write(&path, &o.contents) {
                eprintln!("codegen: {}: {e}", path.display());
                return ExitCode::FAILURE;
            }
            println!("wrote {}", o.path.display());
        }
    }
    println!("{} generated files, {} updated", outputs.len(), stale.len());
    ExitCode::SUCCESS
}
