//! Rust output: typify 0.8 types, the constrained types typify does not
//! enforce, and the payload/receipt dispatch read from the schema's
//! `if/then` correlations.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use heck::{ToSnakeCase, ToUpperCamelCase};
use serde_json::{Map, Value};

use crate::schema::{Bundle, MAX_SAFE_INTEGER};

/// Where the constrained types live, as seen from `types.rs`.
const CONSTRAINED: &str = "super::constrained";

/// A `$defs` entry that typify does not enforce by itself.
#[derive(Debug)]
enum Constrained {
    /// An integer range (typify maps `0..=2^53-1` to a bare `i64`).
    Integer { min: u64, max: u64 },
    /// An array with `uniqueItems`/`minItems`/`maxItems` (typify ignores
    /// the counts and turns `uniqueItems` into a set).
    Array {
        item: String,
        unique: bool,
        min: Option<u64>,
        max: Option<u64>,
    },
    /// `{"type":"boolean","const":true}` (typify emits a plain `bool`).
    True,
    /// An object with `dependentRequired` / `not: {required}` rules; typify
    /// generates the fields as `<Name>Fields`.
    Rules {
        dependent: Vec<(String, Vec<String>)>,
        exclusive: Vec<Vec<String>>,
    },
}

fn classify(bundle: &Bundle, schema: &Value) -> Result<Option<Constrained>, String> {
    let ty = schema.get("type").and_then(Value::as_str);
    Ok(match ty {
        Some("integer") => Some(Constrained::Integer {
            min: schema["minimum"].as_u64().ok_or("minimum")?,
            max: schema["maximum"].as_u64().ok_or("maximum")?,
        }),
        Some("array")
            if ["uniqueItems", "minItems", "maxItems"]
                .iter()
                .any(|k| schema.get(*k).is_some()) =>
        {
            let items = &schema["items"];
            let item = match items.get("$ref").and_then(Value::as_str) {
                Some(r) => bundle.ref_name(r)?,
                None => return Err("constrained arrays need $ref items".into()),
            };
            Some(Constrained::Array {
                item,
                unique: schema.get("uniqueItems") == Some(&Value::Bool(true)),
                min: schema.get("minItems").and_then(Value::as_u64),
                max: schema.get("maxItems").and_then(Value::as_u64),
            })
        }
        Some("boolean") if schema.get("const") == Some(&Value::Bool(true)) => {
            Some(Constrained::True)
        }
        Some("boolean") if schema.get("const").is_some() => {
            return Err("only const true is supported for booleans".into());
        }
        Some("object")
            if schema.get("dependentRequired").is_some() || schema.get("not").is_some() =>
        {
            let mut dependent = Vec::new();
            if let Some(Value::Object(d)) = schema.get("dependentRequired") {
                for (k, v) in d {
                    let deps = v
                        .as_array()
                        .ok_or("dependentRequired")?
                        .iter()
                        .map(|s| s.as_str().map(str::to_string).ok_or("dependentRequired"))
                        .collect::<Result<Vec<_>, _>>()?;
                    dependent.push((k.clone(), deps));
                }
            }
            let mut exclusive = Vec::new();
            if let Some(not) = schema.get("not") {
                let keys: Vec<&String> = not.as_object().ok_or("not")?.keys().collect();
                if keys != ["required"] {
                    return Err("`not` may only hold `required`".into());
                }
                exclusive.push(
                    not["required"]
                        .as_array()
                        .ok_or("not.required")?
                        .iter()
                        .map(|s| s.as_str().map(str::to_string).ok_or("not.required"))
                        .collect::<Result<Vec<_>, _>>()?,
                );
            }
            Some(Constrained::Rules {
                dependent,
                exclusive,
            })
        }
        _ => None,
    })
}

/// Rewrites every `$ref` to the bundle-local `#/$defs/Name` form and drops
/// the keywords typify must not see (they are enforced by the constrained
/// types and the dispatch instead).
fn for_typify(bundle: &Bundle, value: &Value) -> Result<Value, String> {
    Ok(match value {
        Value::Object(obj) => {
            let mut out = Map::new();
            for (k, v) in obj {
                match k.as_str() {
                    "allOf"
                    | "dependentRequired"
                    | "not"
                    | "$schema"
                    | "$id"
                    | crate::wire::STATE_CHANGING
                    | crate::wire::REPLY_RESULT => {}
                    "$ref" => {
                        let name = bundle.ref_name(v.as_str().ok_or("$ref")?)?;
                        out.insert(k.clone(), Value::String(format!("#/$defs/{name}")));
                    }
                    _ => {
                        out.insert(k.clone(), for_typify(bundle, v)?);
                    }
                }
            }
            Value::Object(out)
        }
        Value::Array(a) => Value::Array(
            a.iter()
                .map(|v| for_typify(bundle, v))
                .collect::<Result<_, _>>()?,
        ),
        other => other.clone(),
    })
}

/// The Rust files: `(file name, contents without header)`.
pub fn generate(bundle: &Bundle) -> Result<Vec<(&'static str, String)>, String> {
    let mut constrained = BTreeMap::new();
    for (name, schema) in &bundle.defs {
        if let Some(c) = classify(bundle, schema).map_err(|e| format!("{name}: {e}"))? {
            constrained.insert(name.clone(), c);
        }
    }

    let mut settings = typify::TypeSpaceSettings::default();
    settings
        .with_struct_builder(false)
        .with_derive("PartialEq".to_string())
        .with_map_type("::std::collections::BTreeMap".to_string());
    let mut defs = Vec::new();
    for (name, schema) in &bundle.defs {
        let mut schema = for_typify(bundle, schema)?;
        match constrained.get(name) {
            Some(Constrained::Rules { .. }) => {
                // typify generates the plain fields under `<Name>Fields`;
                // `<Name>` itself is the checked wrapper.
                settings.with_replacement(
                    name,
                    format!("{CONSTRAINED}::{name}"),
                    std::iter::empty(),
                );
                if let Value::Object(o) = &mut schema {
                    o.remove("title");
                }
                defs.push((format!("{name}Fields"), schema.clone()));
            }
            Some(_) => {
                settings.with_replacement(
                    name,
                    format!("{CONSTRAINED}::{name}"),
                    std::iter::empty(),
                );
            }
            None => {}
        }
        defs.push((name.clone(), schema));
    }
    let mut space = typify::TypeSpace::new(&settings);
    let defs = defs
        .into_iter()
        .map(|(n, s)| {
            serde_json::from_value::<schemars::schema::Schema>(s)
                .map(|s| (n.clone(), s))
                .map_err(|e| format!("{n}: {e}"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    space
        .add_ref_types(defs)
        .map_err(|e| format!("typify: {e}"))?;
    let types = format_rust(&space.to_stream().to_string())?;

    let constrained_src = format_rust(&emit_constrained(bundle, &constrained)?)?;
    let dispatch_src = format_rust(&format!(
        "{}{}",
        emit_dispatch(bundle),
        emit_state_changing(bundle)?
    ))?;
    let operations_src = format_rust(&emit_operations(bundle)?)?;
    Ok(vec![
        ("types.rs", types),
        ("constrained.rs", constrained_src),
        ("dispatch.rs", dispatch_src),
        ("operations.rs", operations_src),
    ])
}

/// `Operation::is_state_changing`, from the `x-stateChanging` annotation.
fn emit_state_changing(bundle: &Bundle) -> Result<String, String> {
    let listed = crate::wire::state_changing(bundle)?;
    let arms = listed
        .iter()
        .map(|v| format!("types::Operation::{}", type_name(v)))
        .collect::<Vec<_>>()
        .join(" | ");
    Ok(format!(
        "impl types::Operation {{\n\
             /// Whether the operation changes state and stores a durable receipt\n\
             /// (`x-stateChanging` in `client.v1`).\n\
             pub const fn is_state_changing(self) -> bool {{\n\
                 matches!(self, {arms})\n\
             }}\n\
         }}\n"
    ))
}

/// Formats generated Rust with prettyplease (rustfmt skips these files).
pub fn format_rust(src: &str) -> Result<String, String> {
    let file: syn::File =
        syn::parse_str(src).map_err(|e| format!("generated Rust does not parse: {e}"))?;
    Ok(prettyplease::unparse(&file))
}

fn doc_attr(schema: &Value) -> String {
    match schema.get("description").and_then(Value::as_str) {
        Some(d) => format!("#[doc = {:?}]\n", d),
        None => String::new(),
    }
}

fn emit_constrained(
    bundle: &Bundle,
    constrained: &BTreeMap<String, Constrained>,
) -> Result<String, String> {
    let mut s = String::new();
    s.push_str(
        "//! Types whose schema constraints typify 0.8 does not enforce: integer\n\
         //! ranges, array counts and uniqueness, `const: true`, and\n\
         //! `dependentRequired` / `not: {required}` rules. Deserializing one of\n\
         //! them checks the constraint, so serde rejects what ajv rejects.\n\
         use super::types;\n\n\
         /// A value that violates its schema constraint.\n\
         #[derive(Clone, Copy, Debug, PartialEq, Eq)]\n\
         pub struct ConstraintError(pub &'static str);\n\
         impl ::std::fmt::Display for ConstraintError {\n\
             fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result { f.write_str(self.0) }\n\
         }\n\
         impl ::std::error::Error for ConstraintError {}\n\n",
    );
    for (name, c) in constrained {
        let schema = &bundle.defs[name];
        let doc = doc_attr(schema);
        match c {
            Constrained::Integer { min, max } => {
                assert!(*max <= MAX_SAFE_INTEGER);
                let cond = if min == max {
                    format!("value == {min}")
                } else if *min > 0 {
                    format!("value >= {min} && value <= {max}")
                } else {
                    format!("value <= {max}")
                };
                write!(
                    s,
                    "{doc}#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, ::serde::Serialize)]\n\
                     #[serde(transparent)]\n\
                     pub struct {name}(u64);\n\
                     impl {name} {{\n\
                         /// The smallest allowed value.\n\
                         pub const MIN: u64 = {min};\n\
                         /// The largest allowed value.\n\
                         pub const MAX: u64 = {max};\n\
                         /// The value, if it is in range.\n\
                         pub const fn new(value: u64) -> ::std::option::Option<Self> {{\n\
                             if {cond} {{ ::std::option::Option::Some(Self(value)) }} else {{ ::std::option::Option::None }}\n\
                         }}\n\
                         /// The plain integer.\n\
                         pub const fn get(self) -> u64 {{ self.0 }}\n\
                     }}\n\
                     impl ::std::convert::TryFrom<u64> for {name} {{\n\
                         type Error = ConstraintError;\n\
                         fn try_from(value: u64) -> ::std::result::Result<Self, ConstraintError> {{\n\
                             Self::new(value).ok_or(ConstraintError(\"integer out of range\"))\n\
                         }}\n\
                     }}\n\
                     impl ::std::convert::From<{name}> for u64 {{ fn from(value: {name}) -> u64 {{ value.0 }} }}\n\
                     impl ::std::fmt::Display for {name} {{\n\
                         fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {{ self.0.fmt(f) }}\n\
                     }}\n\
                     impl<'de> ::serde::Deserialize<'de> for {name} {{\n\
                         fn deserialize<D: ::serde::Deserializer<'de>>(deserializer: D) -> ::std::result::Result<Self, D::Error> {{\n\
                             let value = u64::deserialize(deserializer)?;\n\
                             Self::new(value).ok_or_else(|| <D::Error as ::serde::de::Error>::custom(\"integer out of range\"))\n\
                         }}\n\
                     }}\n\n"
                )
                .map_err(|e| e.to_string())?;
            }
            Constrained::Array {
                item,
                unique,
                min,
                max,
            } => {
                let mut checks = String::new();
                match min {
                    // `len() < 1` is clippy's `len_zero`: say it as `is_empty()`.
                    Some(1) => writeln!(checks, "if items.is_empty() {{ return ::std::result::Result::Err(ConstraintError(\"too few items\")); }}").map_err(|e| e.to_string())?,
                    Some(min) => writeln!(checks, "if items.len() < {min} {{ return ::std::result::Result::Err(ConstraintError(\"too few items\")); }}").map_err(|e| e.to_string())?,
                    None => {}
                }
                if let Some(max) = max {
                    writeln!(checks, "if items.len() > {max} {{ return ::std::result::Result::Err(ConstraintError(\"too many items\")); }}").map_err(|e| e.to_string())?;
                }
                if *unique {
                    checks.push_str(
                        "for (i, a) in items.iter().enumerate() {\n\
                             if items[..i].contains(a) { return ::std::result::Result::Err(ConstraintError(\"duplicate items\")); }\n\
                         }\n",
                    );
                }
                let item_ty = if constrained.contains_key(item) {
                    item.clone()
                } else {
                    format!("types::{item}")
                };
                write!(
                    s,
                    "{doc}#[derive(Clone, Debug, PartialEq, ::serde::Serialize)]\n\
                     #[serde(transparent)]\n\
                     pub struct {name}(::std::vec::Vec<{item_ty}>);\n\
                     impl {name} {{\n\
                         /// The items, if they satisfy the array constraints.\n\
                         pub fn new(items: ::std::vec::Vec<{item_ty}>) -> ::std::result::Result<Self, ConstraintError> {{\n\
                             {checks}\n\
                             ::std::result::Result::Ok(Self(items))\n\
                         }}\n\
                         /// The items.\n\
                         pub fn as_slice(&self) -> &[{item_ty}] {{ &self.0 }}\n\
                         /// The items, by value.\n\
                         pub fn into_inner(self) -> ::std::vec::Vec<{item_ty}> {{ self.0 }}\n\
                     }}\n\
                     impl<'de> ::serde::Deserialize<'de> for {name} {{\n\
                         fn deserialize<D: ::serde::Deserializer<'de>>(deserializer: D) -> ::std::result::Result<Self, D::Error> {{\n\
                             let items = ::std::vec::Vec::<{item_ty}>::deserialize(deserializer)?;\n\
                             Self::new(items).map_err(|e| <D::Error as ::serde::de::Error>::custom(e.0))\n\
                         }}\n\
                     }}\n\n"
                )
                .map_err(|e| e.to_string())?;
            }
            Constrained::True => {
                write!(
                    s,
                    "{doc}#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]\n\
                     pub struct {name};\n\
                     impl ::serde::Serialize for {name} {{\n\
                         fn serialize<S: ::serde::Serializer>(&self, serializer: S) -> ::std::result::Result<S::Ok, S::Error> {{ serializer.serialize_bool(true) }}\n\
                     }}\n\
                     impl<'de> ::serde::Deserialize<'de> for {name} {{\n\
                         fn deserialize<D: ::serde::Deserializer<'de>>(deserializer: D) -> ::std::result::Result<Self, D::Error> {{\n\
                             if bool::deserialize(deserializer)? {{ ::std::result::Result::Ok(Self) }} else {{\n\
                                 ::std::result::Result::Err(<D::Error as ::serde::de::Error>::custom(\"expected true\"))\n\
                             }}\n\
                         }}\n\
                     }}\n\n"
                )
                .map_err(|e| e.to_string())?;
            }
            Constrained::Rules {
                dependent,
                exclusive,
            } => {
                let mut checks = String::new();
                for (k, deps) in dependent {
                    for d in deps {
                        writeln!(
                            checks,
                            "if present.contains_key({k:?}) && !present.contains_key({d:?}) {{ return ::std::result::Result::Err(ConstraintError(\"{k} requires {d}\")); }}"
                        )
                        .map_err(|e| e.to_string())?;
                    }
                }
                for set in exclusive {
                    let cond = set
                        .iter()
                        .map(|k| format!("present.contains_key({k:?})"))
                        .collect::<Vec<_>>()
                        .join(" && ");
                    let names = set.join(", ");
                    writeln!(
                        checks,
                        "if {cond} {{ return ::std::result::Result::Err(ConstraintError(\"{names} are mutually exclusive\")); }}"
                    )
                    .map_err(|e| e.to_string())?;
                }
                write!(
                    s,
                    "{doc}#[derive(Clone, Debug, PartialEq, ::serde::Serialize)]\n\
                     #[serde(transparent)]\n\
                     pub struct {name}(types::{name}Fields);\n\
                     impl {name} {{\n\
                         /// The fields, if they satisfy the object's rules.\n\
                         pub fn new(fields: types::{name}Fields) -> ::std::result::Result<Self, ConstraintError> {{\n\
                             let value = ::serde_json::to_value(&fields).map_err(|_| ConstraintError(\"not serializable\"))?;\n\
                             let present = value.as_object().ok_or(ConstraintError(\"not an object\"))?;\n\
                             {checks}\n\
                             ::std::result::Result::Ok(Self(fields))\n\
                         }}\n\
                         /// The fields, by value.\n\
                         pub fn into_fields(self) -> types::{name}Fields {{ self.0 }}\n\
                     }}\n\
                     impl ::std::ops::Deref for {name} {{\n\
                         type Target = types::{name}Fields;\n\
                         fn deref(&self) -> &types::{name}Fields {{ &self.0 }}\n\
                     }}\n\
                     impl<'de> ::serde::Deserialize<'de> for {name} {{\n\
                         fn deserialize<D: ::serde::Deserializer<'de>>(deserializer: D) -> ::std::result::Result<Self, D::Error> {{\n\
                             let fields = types::{name}Fields::deserialize(deserializer)?;\n\
                             Self::new(fields).map_err(|e| <D::Error as ::serde::de::Error>::custom(e.0))\n\
                         }}\n\
                     }}\n\n"
                )
                .map_err(|e| e.to_string())?;
            }
        }
    }
    Ok(s)
}

/// The Rust identifier typify gives a type or a variant named `name`.
fn type_name(name: &str) -> String {
    name.to_upper_camel_case()
}

/// The Rust type of definition `name` (its checked wrapper when it has
/// cross-field rules).
fn resolve_type(bundle: &Bundle, name: &str) -> String {
    if bundle
        .defs
        .get(name)
        .is_some_and(|d| d.get("dependentRequired").is_some())
    {
        format!("super::constrained::{}", type_name(name))
    } else {
        format!("types::{}", type_name(name))
    }
}

/// One marker type per client operation with the types of its request
/// payload and response receipt, from the same correlations as the
/// dispatch (`Request.payload` and `Response.receipt` by `operation`).
fn emit_operations(bundle: &Bundle) -> Result<String, String> {
    let find = |variant: &str, target: &str| {
        bundle
            .correlations
            .iter()
            .find(|c| c.variant == variant && c.target == target && c.selector == "operation")
            .ok_or_else(|| format!("no {variant}.{target} correlation by operation"))
    };
    let payloads = find("Request", "payload")?;
    let receipts = find("Response", "receipt")?;
    let changing = crate::wire::state_changing(bundle)?;
    let bounds = "::serde::Serialize + ::serde::de::DeserializeOwned + ::std::clone::Clone + ::std::fmt::Debug + ::std::marker::Send + ::std::marker::Sync + 'static";
    let mut s = format!(
        "//! One marker type per client `operation`, naming the types of its\n\
         //! request `payload` and response `receipt` (read from the same schema\n\
         //! correlations as `dispatch`): a client sends a typed payload and\n\
         //! gets the typed receipt of the same operation back.\n\
         use super::types;\n\n\
         /// A client operation: its wire name and the types of its payload and receipt.\n\
         pub trait ClientOperation {{\n\
             /// The wire `operation`.\n\
             const OPERATION: types::Operation;\n\
             /// The request `payload`.\n\
             type Payload: {bounds};\n\
             /// The response `receipt`.\n\
             type Receipt: {bounds};\n\
             /// Whether it changes state and stores a durable receipt\n\
             /// (`x-stateChanging`), so it carries an idempotency key.\n\
             const STATE_CHANGING: bool;\n\
         }}\n\n"
    );
    for (value, payload) in &payloads.pairs {
        let receipt = receipts
            .pairs
            .iter()
            .find(|(v, _)| v == value)
            .map(|(_, ty)| ty)
            .ok_or_else(|| format!("operation {value} has a payload but no receipt"))?;
        let v = type_name(value);
        let _ = writeln!(
            s,
            "/// `{value}`\n\
             #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]\n\
             pub struct {v};\n\
             impl ClientOperation for {v} {{\n\
                 const OPERATION: types::Operation = types::Operation::{v};\n\
                 type Payload = {};\n\
                 type Receipt = {};\n\
                 const STATE_CHANGING: bool = {};\n\
             }}\n",
            resolve_type(bundle, payload),
            resolve_type(bundle, receipt),
            changing.contains(value)
        );
    }
    Ok(s)
}

fn emit_dispatch(bundle: &Bundle) -> String {
    let mut s = String::from(
        "//! Typed dispatch read from the schemas' `if {selector const} then\n\
         //! {target $ref}` correlations: the type of `payload` is selected by\n\
         //! `operation`, and so on.\n\
         use super::types;\n\n",
    );
    for c in &bundle.correlations {
        let enum_name = format!("{}{}", type_name(&c.variant), type_name(&c.target));
        let fn_name = format!(
            "parse_{}_{}",
            c.variant.to_snake_case(),
            c.target.to_snake_case()
        );
        let sel_ty = type_name(&c.selector_type);
        let resolve = |n: &str| {
            if bundle
                .defs
                .get(n)
                .is_some_and(|d| d.get("dependentRequired").is_some())
            {
                format!("super::constrained::{}", type_name(n))
            } else {
                format!("types::{}", type_name(n))
            }
        };
        let _ = writeln!(
            s,
            "/// The typed `{target}` of a `{variant}`, one variant per `{selector}`.\n\
             /// It serializes as the selected type alone.\n\
             #[derive(Clone, Debug, PartialEq, ::serde::Serialize)]\n\
             #[serde(untagged)]\n\
             pub enum {enum_name} {{",
            target = c.target,
            variant = c.variant,
            selector = c.selector
        );
        for (value, ty) in &c.pairs {
            let _ = writeln!(
                s,
                "    /// `{value}`\n    {}({}),",
                type_name(value),
                resolve(ty)
            );
        }
        s.push_str("}\n\n");
        let _ = writeln!(
            s,
            "impl {enum_name} {{\n\
             /// The `{selector}` this value belongs to.\n\
             pub fn {selector}(&self) -> types::{sel_ty} {{\n\
                 match self {{",
            selector = c.selector.to_snake_case()
        );
        for (value, _) in &c.pairs {
            let v = type_name(value);
            let _ = writeln!(s, "            Self::{v}(_) => types::{sel_ty}::{v},");
        }
        s.push_str("        }\n    }\n}\n\n");
        let _ = writeln!(
            s,
            "/// Deserializes `value` as the `{target}` type that `{selector}` selects.\n\
             pub fn {fn_name}(\n\
                 {sel}: types::{sel_ty},\n\
                 value: &::serde_json::Value,\n\
             ) -> ::std::result::Result<{enum_name}, ::serde_json::Error> {{\n\
                 use ::serde::Deserialize as _;\n\
                 ::std::result::Result::Ok(match {sel} {{",
            target = c.target,
            selector = c.selector,
            sel = c.selector.to_snake_case()
        );
        for (value, ty) in &c.pairs {
            let v = type_name(value);
            let _ = writeln!(
                s,
                "        types::{sel_ty}::{v} => {enum_name}::{v}({}::deserialize(value)?),",
                resolve(ty)
            );
        }
        s.push_str("    })\n}\n\n");
    }
    s
}
