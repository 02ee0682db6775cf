//! TypeScript types emitted directly from the schema profile.
//!
//! A small emitter instead of json-schema-to-typescript: the profile is
//! narrow (objects, string/integer/boolean scalars, string enums, tagged
//! unions, arrays, maps, any-JSON), so one pass over the same bundle typify
//! reads keeps one source of truth, adds no npm dependency, and can also
//! emit what j2ts cannot: the operation-to-payload maps from the schema's
//! `if/then` correlations and the enum value lists.

use std::fmt::Write as _;

use serde_json::Value;

use crate::schema::{Bundle, enum_values};

fn comment(out: &mut String, schema: &Value, indent: &str) {
    if let Some(d) = schema.get("description").and_then(Value::as_str) {
        let _ = writeln!(out, "{indent}/** {} */", d.replace("*/", "*\\/"));
    }
}

fn type_expr(bundle: &Bundle, schema: &Value) -> Result<String, String> {
    if let Some(r) = schema.get("$ref").and_then(Value::as_str) {
        return bundle.ref_name(r);
    }
    if let Some(c) = schema.get("const") {
        return Ok(c.to_string());
    }
    if let Some(reference) = crate::schema::nullable(schema) {
        return Ok(format!("{} | null", bundle.ref_name(reference)?));
    }
    if let Some(values) = enum_values(schema) {
        return Ok(values
            .iter()
            .map(|v| format!("{v:?}"))
            .collect::<Vec<_>>()
            .join(" | "));
    }
    match schema.get("type").and_then(Value::as_str) {
        None => Ok("JsonValue".to_string()),
        Some("string") => Ok("string".to_string()),
        Some("integer") => Ok("number".to_string()),
        Some("boolean") => Ok("boolean".to_string()),
        Some("array") => {
            let item = type_expr(bundle, &schema["items"])?;
            Ok(if item.contains(' ') {
                format!("Array<{item}>")
            } else {
                format!("{item}[]")
            })
        }
        Some("object") => {
            if schema.get("properties").is_some() {
                return Err("inline object types are not in the profile".into());
            }
            match schema.get("additionalProperties") {
                Some(v) if v.is_object() => {
                    Ok(format!("{{ [key: string]: {} }}", type_expr(bundle, v)?))
                }
                _ => Ok("{ [key: string]: JsonValue }".to_string()),
            }
        }
        Some(other) => Err(format!("type {other}")),
    }
}

fn interface(bundle: &Bundle, out: &mut String, name: &str, schema: &Value) -> Result<(), String> {
    comment(out, schema, "");
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let props = schema.get("properties").and_then(Value::as_object);
    match props {
        Some(props) if !props.is_empty() => {
            let _ = writeln!(out, "export interface {name} {{");
            for (prop, s) in props {
                comment(out, s, "  ");
                let opt = if required.contains(&prop.as_str()) {
                    ""
                } else {
                    "?"
                };
                let _ = writeln!(out, "  {prop:?}{opt}: {};", type_expr(bundle, s)?);
            }
            out.push_str("}\n\n");
        }
        // A closed object without properties.
        _ => {
            let _ = writeln!(out, "export type {name} = Record<string, never>;\n");
        }
    }
    Ok(())
}

/// The contents of `sdk-ts/src/generated/types.ts` (without header).
pub fn generate(bundle: &Bundle) -> Result<String, String> {
    let mut out = String::new();
    out.push_str(
        "/** Any JSON value. */\n\
         export type JsonValue = null | boolean | number | string | JsonValue[] | { [key: string]: JsonValue };\n\n",
    );
    for (name, schema) in &bundle.defs {
        let is_closed_object = schema.get("type").and_then(Value::as_str) == Some("object")
            && schema.get("additionalProperties") == Some(&Value::Bool(false));
        if let Some(Value::Array(variants)) = schema.get("oneOf") {
            let mut names = Vec::new();
            for v in variants {
                match v.get("$ref").and_then(Value::as_str) {
                    Some(r) => names.push(bundle.ref_name(r)?),
                    None => {
                        let title = v["title"].as_str().ok_or("variant title")?;
                        interface(bundle, &mut out, title, v)?;
                        names.push(title.to_string());
                    }
                }
            }
            comment(&mut out, schema, "");
            let _ = writeln!(out, "export type {name} = {};\n", names.join(" | "));
        } else if is_closed_object {
            interface(bundle, &mut out, name, schema)?;
        } else {
            comment(&mut out, schema, "");
            let _ = writeln!(
                out,
                "export type {name} = {};\n",
                type_expr(bundle, schema)?
            );
            if let Some(values) = enum_values(schema) {
                let list = values
                    .iter()
                    .map(|v| format!("{v:?}"))
                    .collect::<Vec<_>>()
                    .join(", ");
                let _ = writeln!(out, "/** Every value of {name}, in schema order. */");
                let _ = writeln!(
                    out,
                    "export const {name}Values: readonly {name}[] = [{list}];\n"
                );
            }
        }
    }
    for c in &bundle.correlations {
        let _ = writeln!(
            out,
            "/** The type of `{}` of a `{}`, by `{}` (from the schema's if/then correlation). */",
            c.target, c.variant, c.selector
        );
        let map_name = format!("{}{}By{}", c.variant, cap(&c.target), cap(&c.selector));
        let _ = writeln!(out, "export interface {map_name} {{");
        for (value, ty) in &c.pairs {
            let _ = writeln!(out, "  {value:?}: {ty};");
        }
        out.push_str("}\n\n");
    }
    Ok(out)
}

fn cap(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_uppercase().chain(c).collect(),
        None => String::new(),
    }
}
