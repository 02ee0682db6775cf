//! The crate graph enforces the client invariants (docs/ARCHITECTURE.md):
//! the CLI (`pi-workflows-cli`) and the client (`pi-workflows-client`)
//! cannot open the state database because nothing they link can — neither
//! the server crate, nor the kernel, nor rusqlite / libsqlite3 is among
//! their normal dependencies, direct or transitive — and the client's list
//! of state-changing operations is the kernel's.

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// Every package's normal (linked) dependencies, by package name, from
/// `cargo metadata` of this workspace.
fn normal_dependencies() -> BTreeMap<String, BTreeSet<String>> {
    // Only this host's dependencies: a clean clone has downloaded nothing
    // for other platforms, and offline metadata must not need them.
    let rustc = std::process::Command::new("rustc")
        .arg("-vV")
        .output()
        .expect("run rustc -vV");
    let rustc = String::from_utf8(rustc.stdout).unwrap();
    let host = rustc
        .lines()
        .find_map(|line| line.strip_prefix("host: "))
        .expect("rustc -vV names the host");
    let output = std::process::Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--offline", "--locked"])
        .args(["--filter-platform", host])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run cargo metadata");
    assert!(
        output.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata: Value = serde_json::from_slice(&output.stdout).unwrap();
    let names: BTreeMap<&str, &str> = metadata["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|package| {
            (
                package["id"].as_str().unwrap(),
                package["name"].as_str().unwrap(),
            )
        })
        .collect();
    let mut graph = BTreeMap::new();
    for node in metadata["resolve"]["nodes"].as_array().unwrap() {
        let deps: BTreeSet<String> = node["deps"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|dep| {
                dep["dep_kinds"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|kind| kind["kind"].is_null())
            })
            .map(|dep| names[dep["pkg"].as_str().unwrap()].to_owned())
            .collect();
        graph.insert(names[node["id"].as_str().unwrap()].to_owned(), deps);
    }
    graph
}

/// `package` and everything it links, transitively.
fn closure(graph: &BTreeMap<String, BTreeSet<String>>, package: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut todo = vec![package.to_owned()];
    while let Some(next) = todo.pop() {
        if seen.insert(next.clone()) {
            todo.extend(graph.get(&next).into_iter().flatten().cloned());
        }
    }
    seen
}

#[test]
fn the_cli_and_the_client_cannot_open_sqlite_by_construction() {
    let graph = normal_dependencies();
    // The check sees SQLite where it is: the server links it.
    assert!(closure(&graph, "server").contains("rusqlite"));
    for package in ["pi-workflows-cli", "pi-workflows-client"] {
        let linked = closure(&graph, package);
        assert!(linked.contains("protocol"), "{package} speaks the protocol");
        for forbidden in ["server", "kernel", "rusqlite", "libsqlite3-sys"] {
            assert!(
                !linked.contains(forbidden),
                "{package} links {forbidden}: {linked:?}"
            );
        }
    }
    assert!(closure(&graph, "pi-workflows-cli").contains("pi-workflows-client"));
}

/// The client's idempotency rule (`ClientOperation::STATE_CHANGING`) and the
/// kernel's receipt operations come from one list, the schema's
/// `x-stateChanging`: every `Operation` the schema names is state-changing
/// for `protocol` exactly when the kernel stores a receipt for it.
#[test]
fn the_clients_state_changing_operations_are_the_kernels_command_operations() {
    use kernel::receipt::CommandOperation;
    use protocol::ClientOperation;
    let schema: Value =
        serde_json::from_str(include_str!("../../protocol/client.v1.schema.json")).unwrap();
    let names = schema["$defs"]["Operation"]["enum"].as_array().unwrap();
    let mut commands = 0;
    for name in names {
        let name = name.as_str().unwrap();
        let operation: protocol::generated::types::Operation = name.parse().unwrap();
        let kernel_says = CommandOperation::from_wire(name).is_some();
        assert_eq!(operation.is_state_changing(), kernel_says, "{name}");
        commands += usize::from(kernel_says);
    }
    println!(
        "{commands} of {} operations are state-changing",
        names.len()
    );
    assert_eq!(
        commands,
        CommandOperation::ALL.len(),
        "every kernel command is an operation of the schema"
    );
    // The markers the client sends by carry the same rule.
    fn marker<Op: ClientOperation>() -> (protocol::generated::types::Operation, bool) {
        (Op::OPERATION, Op::STATE_CHANGING)
    }
    for (operation, state_changing) in [
        marker::<protocol::ops::RunStart>(),
        marker::<protocol::ops::RunPause>(),
        marker::<protocol::ops::SessionViewClearTerminal>(),
        marker::<protocol::ops::RunsList>(),
        marker::<protocol::ops::Subscribe>(),
    ] {
        assert_eq!(operation.is_state_changing(), state_changing, "{operation}");
    }
}
