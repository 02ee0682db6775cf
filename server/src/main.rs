//! `pi-workflows`: the server and its command-line client.
#![allow(clippy::print_stdout, clippy::print_stderr)]

fn main() {
    let config = match server::config::Config::from_env() {
        Ok(config) => config,
        Err(error) => {
            eprintln!("pi-workflows: {error}");
            std::process::exit(2);
        }
    };
    let _ = (config, server::fault::Faults::from_env());
}
