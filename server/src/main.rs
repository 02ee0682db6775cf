//! `pi-workflows`: the server and its command-line client.

fn main() -> std::process::ExitCode {
    server::cli::main()
}
