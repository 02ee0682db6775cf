//! The wire vocabulary the kernel and the shells share, generated once from
//! the schemas so it is never written by hand twice:
//!
//! - `kernel/src/generated.rs`: [`WireCode`] (every `ErrorCode` of
//!   `common.v1`) and `CommandOperation` (the operations `client.v1` marks
//!   `x-stateChanging`), for the `no_std` kernel, which must not depend on
//!   `protocol`;
//! - `server/src/wire/generated.rs`: the exhaustive conversions from the
//!   kernel's enums to `protocol`'s (a new code does not compile until both
//!   sides have it);
//! - the `STATE_CHANGING_OPERATIONS` constant of the TypeScript types
//!   ([`ts_state_changing`]);
//! - the `ReplyResultByMessageType` map and `REPLY_RESULT_TYPES` of the
//!   TypeScript types ([`ts_reply_results`]).
//!
//! `x-stateChanging` is an annotation on `client.v1`'s `Operation` enum: the
//! list of operations that store a durable receipt. Codegen checks that
//! every listed name is one of the enum's values.
//!
//! `x-replyResult` is an annotation on a variant of `runner.v1`'s
//! `RunnerMessage`: the types the `result` of an accepted reply to that
//! message may have (a reply names no message type, so the schema cannot
//! correlate them with `if/then`). Codegen checks that every name is a
//! closed object of the bundle.

use std::fmt::Write as _;

use heck::ToUpperCamelCase;
use serde_json::Value;

use crate::schema::{Bundle, enum_values};

/// The annotation that lists the state-changing operations.
pub const STATE_CHANGING: &str = "x-stateChanging";

/// The annotation that names the result types of a runner message's reply.
pub const REPLY_RESULT: &str = "x-replyResult";

/// `(message type, result type names)` of every `RunnerMessage` variant
/// with `x-replyResult`, in schema order.
pub fn reply_results(bundle: &Bundle) -> Result<Vec<(String, Vec<String>)>, String> {
    let variants = bundle
        .defs
        .get("RunnerMessage")
        .and_then(|message| message.get("oneOf"))
        .and_then(Value::as_array)
        .ok_or("$defs/RunnerMessage must be a union")?;
    let mut out = Vec::new();
    for variant in variants {
        let Some(names) = variant.get(REPLY_RESULT) else {
            continue;
        };
        let title = variant["title"].as_str().unwrap_or_default();
        let (_, message_type) = crate::schema::variant_tag(variant)
            .ok_or_else(|| format!("RunnerMessage/{title}: no tag"))?;
        let names = names
            .as_array()
            .filter(|names| !names.is_empty())
            .ok_or_else(|| format!("RunnerMessage/{title}: {REPLY_RESULT} must list type names"))?
            .iter()
            .map(|name| {
                let name = name
                    .as_str()
                    .ok_or_else(|| format!("RunnerMessage/{title}: {REPLY_RESULT}"))?;
                let closed = bundle.defs.get(name).is_some_and(|def| {
                    def.get("type").and_then(Value::as_str) == Some("object")
                        && def.get("additionalProperties") == Some(&Value::Bool(false))
                });
                if !closed {
                    return Err(format!(
                        "RunnerMessage/{title}: {REPLY_RESULT} names {name}, not a closed object of the schemas"
                    ));
                }
                Ok(name.to_string())
            })
            .collect::<Result<Vec<_>, _>>()?;
        out.push((message_type, names));
    }
    Ok(out)
}

fn values_of(bundle: &Bundle, name: &str) -> Result<Vec<String>, String> {
    let def = bundle
        .defs
        .get(name)
        .ok_or_else(|| format!("no $defs/{name}"))?;
    enum_values(def).ok_or_else(|| format!("$defs/{name} is not a string enum"))
}

/// The state-changing operations, in `Operation` enum order.
pub fn state_changing(bundle: &Bundle) -> Result<Vec<String>, String> {
    let all = values_of(bundle, "Operation")?;
    let listed = bundle.defs["Operation"]
        .get(STATE_CHANGING)
        .and_then(Value::as_array)
        .ok_or("$defs/Operation needs an x-stateChanging array")?
        .iter()
        .map(|v| v.as_str().map(str::to_string).ok_or("x-stateChanging"))
        .collect::<Result<Vec<_>, _>>()?;
    for name in &listed {
        if !all.contains(name) {
            return Err(format!("x-stateChanging names {name}, not an Operation"));
        }
    }
    Ok(all.into_iter().filter(|n| listed.contains(n)).collect())
}

fn variant(name: &str) -> String {
    name.to_upper_camel_case()
}

/// `kernel/src/generated.rs` (without the header).
pub fn kernel(bundle: &Bundle) -> Result<String, String> {
    let codes = values_of(bundle, "ErrorCode")?;
    let operations = state_changing(bundle)?;
    let mut s = String::from(
        "//! The wire vocabulary of the kernel, generated from the schemas: the\n\
         //! closed error codes (`common.v1` `ErrorCode`) every rejection maps to,\n\
         //! and the state-changing operations (`client.v1` `Operation`s marked\n\
         //! `x-stateChanging`) that store a durable receipt.\n\
         use serde::{Deserialize, Serialize};\n\n",
    );
    enum_block(
        &mut s,
        "WireCode",
        "A closed wire error code (`ErrorCode` of `common.v1`).",
        &codes,
    );
    enum_block(
        &mut s,
        "CommandOperation",
        "A state-changing client operation: the ones that store a receipt\n/// (`x-stateChanging` in `client.v1`). Reads, subscriptions and session\n/// reports are not commands and store nothing.",
        &operations,
    );
    Ok(s)
}

fn enum_block(s: &mut String, name: &str, doc: &str, values: &[String]) {
    let _ = writeln!(
        s,
        "/// {doc}\n\
         #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]\n\
         pub enum {name} {{"
    );
    for v in values {
        let _ = writeln!(s, "    #[serde(rename = {v:?})]\n    {},", variant(v));
    }
    s.push_str("}\n\n");
    let _ = writeln!(
        s,
        "impl {name} {{\n    /// Every value, in schema order.\n    pub const ALL: [Self; {}] = [",
        values.len()
    );
    for v in values {
        let _ = writeln!(s, "        Self::{},", variant(v));
    }
    s.push_str("    ];\n\n    /// The value's name on the wire.\n    pub const fn wire_name(self) -> &'static str {\n        match self {\n");
    for v in values {
        let _ = writeln!(s, "            Self::{} => {v:?},", variant(v));
    }
    s.push_str("        }\n    }\n\n    /// The value with this wire name.\n    pub fn from_wire(name: &str) -> Option<Self> {\n        Some(match name {\n");
    for v in values {
        let _ = writeln!(s, "            {v:?} => Self::{},", variant(v));
    }
    s.push_str("            _ => return None,\n        })\n    }\n}\n\n");
}

/// `server/src/wire/generated.rs` (without the header): the exhaustive
/// conversions from the kernel's wire enums to `protocol`'s.
pub fn server(bundle: &Bundle) -> Result<String, String> {
    let codes = values_of(bundle, "ErrorCode")?;
    let all = values_of(bundle, "Operation")?;
    let operations = state_changing(bundle)?;
    let mut s = String::from(
        "//! Exhaustive conversions between the kernel's generated wire enums and\n\
         //! `protocol`'s generated types: a code or operation added to the schema\n\
         //! does not compile until both sides have it.\n\
         use kernel::generated::{CommandOperation, WireCode};\n\
         use protocol::generated::types::{ErrorCode, Operation};\n\n\
         /// The protocol error code of a kernel wire code.\n\
         pub const fn error_code(code: WireCode) -> ErrorCode {\n    match code {\n",
    );
    for v in &codes {
        let _ = writeln!(s, "        WireCode::{0} => ErrorCode::{0},", variant(v));
    }
    s.push_str("    }\n}\n\n/// The kernel's command operation of a client operation; `None` for the\n/// operations that store no receipt.\npub const fn command_operation(operation: Operation) -> Option<CommandOperation> {\n    match operation {\n");
    for v in &all {
        if operations.contains(v) {
            let _ = writeln!(
                s,
                "        Operation::{0} => Some(CommandOperation::{0}),",
                variant(v)
            );
        } else {
            let _ = writeln!(s, "        Operation::{} => None,", variant(v));
        }
    }
    s.push_str("    }\n}\n");
    Ok(s)
}

/// The TypeScript constant (appended to `types.ts`).
pub fn ts_state_changing(bundle: &Bundle) -> Result<String, String> {
    let list = state_changing(bundle)?
        .iter()
        .map(|v| format!("  {v:?},\n"))
        .collect::<String>();
    Ok(format!(
        "/** The operations that store a durable receipt (`x-stateChanging` on client.v1's Operation): they get an idempotency key. */\n\
         export const STATE_CHANGING_OPERATIONS: ReadonlySet<Operation> = new Set<Operation>([\n{list}]);\n"
    ))
}

/// The TypeScript map of reply results (appended to `types.ts`).
pub fn ts_reply_results(bundle: &Bundle) -> Result<String, String> {
    let results = reply_results(bundle)?;
    let mut s = String::from(
        "/** The `result` of an accepted reply, by the type of the runner message it answers (`x-replyResult` on runner.v1's RunnerMessage variants); every other reply's result is null. */\n\
         export interface ReplyResultByMessageType {\n",
    );
    for (message, names) in &results {
        let _ = writeln!(s, "  {message:?}: {};", names.join(" | "));
    }
    s.push_str(
        "}\n\n/** The result type names of each message of ReplyResultByMessageType (the runner validators have a `validate<Name>` for each). */\n\
         export const REPLY_RESULT_TYPES: { readonly [T in keyof ReplyResultByMessageType]: readonly string[] } = {\n",
    );
    for (message, names) in &results {
        let list = names
            .iter()
            .map(|name| format!("{name:?}"))
            .collect::<Vec<_>>()
            .join(", ");
        let _ = writeln!(s, "  {message:?}: [{list}],");
    }
    s.push_str("};\n");
    Ok(s)
}
