//! The shape of `server/src`, read from its source text: where SQL lives,
//! how server paths log, the import graph between top-level modules, and
//! that wire documents are built and read through generated types.
//!
//! SQL outside `store/`, `eprintln!`, import cycles, `json!` documents and
//! JSON fields read by name (outside `bin/` and test modules) have no
//! exceptions.
//! Each prints the listing it checked.
//! The source root is `$CARGO_MANIFEST_DIR/src`, read when the test runs.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn source_root() -> PathBuf {
    let dir = std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    Path::new(&dir).join("src")
}

/// Every `.rs` file under `dir`, as (path relative to `src`, text).
fn sources(dir: &Path, root: &Path, out: &mut Vec<(String, String)>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            sources(&path, root, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let relative = path
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            out.push((relative, std::fs::read_to_string(&path).unwrap()));
        }
    }
}

/// The server's own files: not the CLI, the binary entry points, the
/// scripted test runner or the deterministic simulation (`simulation/`, a
/// test double compiled only with `cfg(test)`, which writes runner and
/// client frames as JSON and prints its trace).
fn server_sources() -> Vec<(String, String)> {
    let root = source_root();
    let mut all = Vec::new();
    sources(&root, &root, &mut all);
    all.into_iter()
        .filter(|(path, _)| {
            !(path.starts_with("cli/")
                || path.starts_with("bin/")
                || path.starts_with("simulation/")
                || path == "main.rs")
        })
        .collect()
}

/// Lines of code (comment lines dropped).
fn code_lines(text: &str) -> impl Iterator<Item = &str> {
    text.lines().filter(|line| {
        let trimmed = line.trim_start();
        !(trimmed.starts_with("//") || trimmed.starts_with("/*") || trimmed.starts_with('*'))
    })
}

const SQL_MARKERS: [&str; 8] = [
    "\"SELECT ",
    "\"INSERT ",
    "\"UPDATE ",
    "\"DELETE ",
    "\"WITH ",
    "execute_cached(",
    "query_row_cached(",
    "prepare_cached(",
];

#[test]
fn sql_appears_only_under_store() {
    let mut listing = BTreeMap::new();
    for (path, text) in server_sources() {
        if path.starts_with("store/") {
            continue;
        }
        let count = code_lines(&text)
            .filter(|line| SQL_MARKERS.iter().any(|marker| line.contains(marker)))
            .count();
        if count > 0 {
            listing.insert(path, count);
        }
    }
    println!("SQL statements outside server/src/store/ (file: lines):");
    for (path, count) in &listing {
        println!("  {path}: {count}");
    }
    assert!(
        listing.is_empty(),
        "SQL belongs in server/src/store/; SQL outside it in {listing:?}"
    );
}

#[test]
fn server_paths_log_through_crate_log() {
    // `eprintln!` and `println!` panic when the stream cannot be written
    // (a full disk under host/server.log); `crate::log::line` never does.
    let mut offenders = Vec::new();
    for (path, text) in server_sources() {
        for (number, line) in text.lines().enumerate() {
            let trimmed = line.trim_start();
            if trimmed.starts_with("//") {
                continue;
            }
            if ["eprintln!", "println!", "eprint!(", "print!(", "dbg!("]
                .iter()
                .any(|m| line.contains(m))
            {
                offenders.push(format!("{path}:{}: {}", number + 1, line.trim()));
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "server paths must log with crate::log::line:\n{}",
        offenders.join("\n")
    );
}

/// The top-level module a `crate::` path names.
fn top_module(path: &str) -> Option<String> {
    let name: String = path
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    (!name.is_empty()).then_some(name)
}

/// Every top-level module named by `crate::…` in `text`, including grouped
/// imports (`use crate::{a, b::c}`).
fn crate_references(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for line in code_lines(text) {
        let mut rest = line;
        while let Some(at) = rest.find("crate::") {
            rest = &rest[at + "crate::".len()..];
            if let Some(group) = rest.strip_prefix('{') {
                let end = group.find('}').unwrap_or(group.len());
                for part in group[..end].split(',') {
                    if let Some(module) = top_module(part.trim()) {
                        found.insert(module);
                    }
                }
            } else if let Some(module) = top_module(rest) {
                found.insert(module);
            }
        }
    }
    found
}

/// Tarjan's strongly connected components with more than one member.
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<BTreeSet<String>> {
    struct State<'a> {
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        next: usize,
        out: Vec<BTreeSet<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, node: &'a str) {
        s.index.insert(node, s.next);
        s.low.insert(node, s.next);
        s.next += 1;
        s.stack.push(node);
        s.on_stack.insert(node);
        if let Some(edges) = s.graph.get(node) {
            for next in edges {
                let next = next.as_str();
                if !s.graph.contains_key(next) {
                    continue;
                }
                if !s.index.contains_key(next) {
                    visit(s, next);
                    let low = s.low[next].min(s.low[node]);
                    s.low.insert(node, low);
                } else if s.on_stack.contains(next) {
                    let low = s.index[next].min(s.low[node]);
                    s.low.insert(node, low);
                }
            }
        }
        if s.low[node] == s.index[node] {
            let mut component = BTreeSet::new();
            while let Some(member) = s.stack.pop() {
                s.on_stack.remove(member);
                component.insert(member.to_owned());
                if member == node {
                    break;
                }
            }
            if component.len() > 1 {
                s.out.push(component);
            }
        }
    }
    let mut state = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for node in graph.keys() {
        if !state.index.contains_key(node.as_str()) {
            visit(&mut state, node);
        }
    }
    state.out
}

#[test]
fn server_src_has_no_import_cycle() {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (path, text) in server_sources() {
        let module = top_module(&path).expect("a file name");
        let module = if module == "lib" {
            continue;
        } else {
            module
        };
        let edges = graph.entry(module.clone()).or_default();
        for target in crate_references(&text) {
            if target != module {
                edges.insert(target);
            }
        }
    }
    let found = cycles(&graph);
    println!("import graph of server/src (top-level module -> modules it names):");
    for (module, edges) in &graph {
        println!(
            "  {module} -> {}",
            Vec::from_iter(edges.iter().cloned()).join(", ")
        );
    }
    for component in &found {
        println!(
            "cycle ({} modules): {}",
            component.len(),
            Vec::from_iter(component.iter().cloned()).join(", ")
        );
    }
    let listed: Vec<String> = found
        .iter()
        .map(|component| Vec::from_iter(component.iter().cloned()).join(", "))
        .collect();
    assert!(
        found.is_empty(),
        "server/src has import cycles (break them by moving the shared piece down a layer \
         or reporting upward through context::Ports): {listed:?}"
    );
}

/// The check itself: a cycle planted in source text (two modules naming
/// each other, one through a grouped import) is found and listed, and the
/// same modules without the back edge are not.
#[test]
fn the_cycle_check_finds_a_planted_cycle() {
    let graph_of = |sources: &[(&str, &str)]| {
        let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (module, text) in sources {
            let edges = graph.entry((*module).to_owned()).or_default();
            for target in crate_references(text) {
                if target != *module {
                    edges.insert(target);
                }
            }
        }
        graph
    };
    let planted = graph_of(&[
        ("store", "use crate::ids;\nuse crate::{clock, time::wakes};"),
        ("time", "use crate::store::Commit;"),
        ("ids", ""),
        ("clock", ""),
    ]);
    let found = cycles(&planted);
    assert_eq!(
        found,
        vec![BTreeSet::from(["store".to_owned(), "time".to_owned()])]
    );
    let layered = graph_of(&[
        ("store", "use crate::ids;\nuse crate::clock;"),
        ("time", "use crate::store::Commit;"),
        ("ids", ""),
        ("clock", ""),
    ]);
    assert!(cycles(&layered).is_empty());
}

/// The code of a file before its `#[cfg(test)]` module (test modules close
/// their files), comment lines dropped.
fn non_test_code(text: &str) -> Vec<&str> {
    code_lines(text)
        .take_while(|line| line.trim() != "#[cfg(test)]")
        .collect()
}

/// `json!(` lines per file of `server/src` outside `bin/` (the scripted
/// runner is a test double) and outside test modules.
fn json_macro_lines(files: &[(String, String)]) -> BTreeMap<String, usize> {
    let mut listing = BTreeMap::new();
    for (path, text) in files {
        if path.starts_with("bin/") || path.starts_with("simulation/") {
            continue;
        }
        let count = non_test_code(text)
            .iter()
            .filter(|line| line.contains("json!("))
            .count();
        if count > 0 {
            listing.insert(path.clone(), count);
        }
    }
    listing
}

fn all_sources() -> Vec<(String, String)> {
    let root = source_root();
    let mut all = Vec::new();
    sources(&root, &root, &mut all);
    all
}

#[test]
fn wire_documents_are_built_from_generated_types() {
    let listing = json_macro_lines(&all_sources());
    println!("json! lines in server/src outside bin/ and test modules (file: lines):");
    for (path, count) in &listing {
        println!("  {path}: {count}");
    }
    assert!(
        listing.is_empty(),
        "hand-written json! documents; build wire documents from protocol::generated::types: {listing:?}"
    );
}

#[test]
fn the_json_macro_check_finds_a_planted_document() {
    let mut files = all_sources();
    files.push((
        "client_api/planted.rs".to_owned(),
        "fn receipt() -> Value {\n    json!({ \"runId\": \"r1\" })\n}\n\n#[cfg(test)]\nmod tests {\n    fn fixture() { json!({}); }\n}\n"
            .to_owned(),
    ));
    files.push((
        "bin/planted.rs".to_owned(),
        "fn scripted() { json!({}); }\n".to_owned(),
    ));
    let listing = json_macro_lines(&files);
    assert_eq!(
        listing.get("client_api/planted.rs"),
        Some(&1),
        "the planted json! is found, its test module's is not"
    );
    assert_eq!(
        listing.get("bin/planted.rs"),
        None,
        "the scripted runner is exempt"
    );
}

/// Ways of reading a JSON value's field by its name: `.get("…")`,
/// `.pointer(…)` and indexing with a string literal (`value["…"]`; an array
/// literal such as `vec!["…"]` or `&["…"]` follows no name and is not one).
fn field_reads(line: &str) -> Vec<&'static str> {
    let mut found = Vec::new();
    if line.contains(".get(\"") {
        found.push(".get(\"…\")");
    }
    if line.contains(".pointer(") {
        found.push(".pointer(…)");
    }
    let bytes = line.as_bytes();
    let indexes = bytes.windows(3).any(|window| {
        (window[0].is_ascii_alphanumeric() || matches!(window[0], b'_' | b')' | b']'))
            && window[1] == b'['
            && window[2] == b'"'
    });
    if indexes {
        found.push("x[\"…\"]");
    }
    found
}

/// Lines outside `bin/` and test modules that read a JSON field by name.
fn field_read_offenders(files: &[(String, String)]) -> Vec<String> {
    let mut offenders = Vec::new();
    for (path, text) in files {
        if path.starts_with("bin/") || path.starts_with("simulation/") {
            continue;
        }
        for line in non_test_code(text) {
            let reads = field_reads(line);
            if !reads.is_empty() {
                offenders.push(format!("{path}: {} in `{}`", reads.join(", "), line.trim()));
            }
        }
    }
    offenders
}

/// Decoded frames and stored documents are read through their generated
/// types (an exhaustive match over a typed value), never by looking a field
/// up by name in a `serde_json::Value`.
#[test]
fn no_server_path_reads_a_json_field_by_name() {
    let offenders = field_read_offenders(&all_sources());
    println!("JSON fields read by name in server/src outside bin/ and test modules:");
    for offender in &offenders {
        println!("  {offender}");
    }
    assert!(
        offenders.is_empty(),
        "read these values through their generated types:\n{}",
        offenders.join("\n")
    );
}

#[test]
fn the_field_read_check_finds_a_planted_read() {
    let mut files = all_sources();
    files.push((
        "runner_api/planted.rs".to_owned(),
        [
            "fn kind(reply: &Value) -> Option<&str> {",
            "    reply.get(\"type\").and_then(Value::as_str)",
            "}",
            "fn event(value: &Value) -> &Value { value.pointer(\"/event/kind\").unwrap() }",
            "fn outcome(reply: &Value) -> &Value { &reply[\"outcome\"] }",
            "fn names() -> Vec<&'static str> { vec![\"a\", \"b\"] }",
            "#[cfg(test)]",
            "mod tests {",
            "    fn fixture(value: &Value) { let _ = &value[\"runId\"]; }",
            "}",
        ]
        .join("\n"),
    ));
    files.push((
        "bin/planted.rs".to_owned(),
        "fn scripted(value: &Value) { let _ = value.get(\"result\"); }\n".to_owned(),
    ));
    let offenders = field_read_offenders(&files);
    let planted: Vec<&String> = offenders
        .iter()
        .filter(|line| line.starts_with("runner_api/planted.rs:"))
        .collect();
    assert_eq!(
        planted.len(),
        3,
        "the .get, .pointer and index reads are found; the vec! literal and the test module are not: {planted:?}"
    );
    assert!(
        !offenders.iter().any(|line| line.starts_with("bin/")),
        "the scripted runner is exempt"
    );
}
