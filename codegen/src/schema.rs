//! Loading the protocol schemas, checking them against the profile the
//! generators support, and resolving references across files.
//!
//! The profile (see `docs/PROTOCOL.md`, "Schema profile"):
//! - every `$ref` names a `$defs` entry (`#/$defs/X`, `<file>#/$defs/X`) or a
//!   whole file (`<file>`, meaning its titled root);
//! - names are unique across all files;
//! - every integer is a `$defs` entry with `minimum` and `maximum`, and the
//!   maximum is at most 2^53-1;
//! - arrays with `uniqueItems`, `minItems` or `maxItems` are `$defs` entries;
//! - unions are an inline `oneOf` of titled objects with
//!   `additionalProperties: false` and a required `const` tag property;
//! - a nullable value is `oneOf: [{$ref}, {type: null}]`, only as a required
//!   property (Rust `Option<T>` written as `null`, TypeScript `T | null`);
//! - an optional property is never an array, a map, or any-JSON (`{}`): the
//!   Rust types would accept `[]`/`{}`/`null` there differently from ajv;
//! - `allOf` appears only as the `if {P const} then {Q $ref}` correlation.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde_json::{Map, Value};

/// The largest integer both languages represent exactly.
pub const MAX_SAFE_INTEGER: u64 = 9_007_199_254_740_991;

/// The schema files, in dependency order.
pub const FILES: [&str; 4] = ["common", "run-view", "client", "runner"];

/// One `if {selector const} then {target $ref}` table on a union variant.
#[derive(Debug, Clone)]
pub struct Correlation {
    /// The union the variant belongs to (for example `ClientMessage`).
    pub union: String,
    /// The variant title (for example `Request`).
    pub variant: String,
    /// The selecting property (for example `operation`).
    pub selector: String,
    /// The selector's `$defs` type (for example `Operation`).
    pub selector_type: String,
    /// The selected property (for example `payload`).
    pub target: String,
    /// Selector value to the name of the selected type.
    pub pairs: Vec<(String, String)>,
}

/// All definitions of all schema files, by unique name.
#[derive(Debug)]
pub struct Bundle {
    /// Name to schema (roots are stored under their title).
    pub defs: BTreeMap<String, Value>,
    /// Root title per file stem (`common` has none).
    pub roots: BTreeMap<String, String>,
    /// The correlations found on union variants.
    pub correlations: Vec<Correlation>,
}

impl Bundle {
    /// Loads and checks every schema file under `dir`.
    pub fn load(dir: &Path) -> Result<Self, String> {
        let mut defs = BTreeMap::new();
        let mut roots = BTreeMap::new();
        for stem in FILES {
            let path = dir.join(format!("{stem}.v1.schema.json"));
            let text =
                std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            let doc: Value =
                serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
            let obj = doc
                .as_object()
                .ok_or_else(|| format!("{stem}: not an object"))?;
            if obj.get("$schema").and_then(Value::as_str)
                != Some("https://json-schema.org/draft/2020-12/schema")
            {
                return Err(format!("{stem}: $schema must be JSON Schema 2020-12"));
            }
            if let Some(Value::Object(d)) = obj.get("$defs") {
                for (name, schema) in d {
                    if defs.insert(name.clone(), schema.clone()).is_some() {
                        return Err(format!("duplicate definition name {name}"));
                    }
                }
            }
            let has_root = obj.contains_key("oneOf") || obj.contains_key("properties");
            if has_root {
                let title = obj
                    .get("title")
                    .and_then(Value::as_str)
                    .ok_or_else(|| format!("{stem}: a root type needs a title"))?
                    .to_string();
                let mut root = obj.clone();
                for k in ["$schema", "$id", "$defs"] {
                    root.remove(k);
                }
                if defs.insert(title.clone(), Value::Object(root)).is_some() {
                    return Err(format!("duplicate definition name {title}"));
                }
                roots.insert(stem.to_string(), title);
            }
        }
        let mut bundle = Bundle {
            defs,
            roots,
            correlations: Vec::new(),
        };
        bundle.check()?;
        bundle.correlations = bundle.find_correlations()?;
        Ok(bundle)
    }

    /// The definition name a `$ref` string points at.
    pub fn ref_name(&self, reference: &str) -> Result<String, String> {
        if let Some(idx) = reference.find("#/$defs/") {
            let name = &reference[idx + "#/$defs/".len()..];
            if self.defs.contains_key(name) {
                return Ok(name.to_string());
            }
            return Err(format!("unresolved $ref {reference}"));
        }
        if let Some(title) = reference
            .strip_suffix(".v1.schema.json")
            .and_then(|stem| self.roots.get(stem))
        {
            return Ok(title.clone());
        }
        Err(format!("unsupported $ref {reference}"))
    }

    /// Follows `$ref`s until a schema that is not a bare reference.
    pub fn resolve<'a>(&'a self, schema: &'a Value) -> Result<&'a Value, String> {
        let mut current = schema;
        for _ in 0..16 {
            match current.get("$ref").and_then(Value::as_str) {
                Some(r) => current = &self.defs[&self.ref_name(r)?],
                None => return Ok(current),
            }
        }
        Err("reference cycle".into())
    }

    fn check(&self) -> Result<(), String> {
        let mut titles = BTreeSet::new();
        for (name, schema) in &self.defs {
            self.check_schema(name, schema, true, &mut titles)
                .map_err(|e| format!("{name}: {e}"))?;
        }
        Ok(())
    }

    fn check_schema(
        &self,
        at: &str,
        schema: &Value,
        is_def: bool,
        titles: &mut BTreeSet<String>,
    ) -> Result<(), String> {
        let Some(obj) = schema.as_object() else {
            return Err(format!("{at}: boolean schemas are not in the profile"));
        };
        if obj.contains_key("discriminator") {
            return Err(format!(
                "{at}: the discriminator keyword is not in the profile"
            ));
        }
        if let Some(r) = obj.get("$ref") {
            let r = r
                .as_str()
                .ok_or_else(|| format!("{at}: $ref must be a string"))?;
            self.ref_name(r)?;
            return Ok(());
        }
        if let Some(Value::Array(types)) = obj.get("type") {
            return Err(format!(
                "{at}: type arrays ({types:?}) are not in the profile"
            ));
        }
        if let Some(reference) = nullable(schema) {
            self.ref_name(reference)?;
            return Ok(());
        }
        let ty = obj.get("type").and_then(Value::as_str);
        match ty {
            Some("integer") => {
                if !is_def {
                    return Err(format!("{at}: integers must be $defs entries"));
                }
                let max = obj.get("maximum").and_then(Value::as_u64);
                let min = obj.get("minimum").and_then(Value::as_u64);
                match (min, max) {
                    (Some(lo), Some(hi)) if lo <= hi && hi <= MAX_SAFE_INTEGER => {}
                    _ => {
                        return Err(format!(
                            "{at}: integers need 0 <= minimum <= maximum <= 2^53-1"
                        ));
                    }
                }
            }
            Some("number") => {
                return Err(format!("{at}: non-integer numbers are not in the profile"));
            }
            Some("array") => {
                let constrained = ["uniqueItems", "minItems", "maxItems"]
                    .iter()
                    .any(|k| obj.contains_key(*k));
                if constrained && !is_def {
                    return Err(format!("{at}: constrained arrays must be $defs entries"));
                }
                let items = obj
                    .get("items")
                    .ok_or_else(|| format!("{at}: arrays need items"))?;
                self.check_schema(&format!("{at}[]"), items, false, titles)?;
            }
            Some("boolean") => {
                if obj.contains_key("const") && !is_def {
                    return Err(format!("{at}: boolean constants must be $defs entries"));
                }
            }
            Some("string") | Some("object") | None => {}
            Some(other) => return Err(format!("{at}: type {other} is not in the profile")),
        }
        if let Some(props) = obj.get("properties").and_then(Value::as_object) {
            if obj.get("additionalProperties") != Some(&Value::Bool(false)) {
                return Err(format!(
                    "{at}: objects with properties need additionalProperties: false"
                ));
            }
            let required: BTreeSet<&str> = obj
                .get("required")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            for (prop, s) in props {
                let here = format!("{at}.{prop}");
                self.check_schema(&here, s, false, titles)?;
                if nullable(s).is_some() && !required.contains(prop.as_str()) {
                    // Absent and `null` would be one Rust `None`.
                    return Err(format!("{here}: a nullable property must be required"));
                }
                if !required.contains(prop.as_str()) {
                    // Inline arrays and maps become `Vec`/`Map` fields that
                    // typify defaults when absent (so `[]` re-encodes as
                    // absent); any-JSON becomes `Option<Value>` (so `null`
                    // re-encodes as absent). A `$ref` to a named array or
                    // map is an `Option<Newtype>` and is fine.
                    let resolved = self.resolve(s)?;
                    let kind = s.get("type").and_then(Value::as_str);
                    let is_any = resolved.get("type").is_none()
                        && !resolved.as_object().is_some_and(|o| {
                            o.contains_key("oneOf")
                                || o.contains_key("enum")
                                || o.contains_key("const")
                        });
                    let is_map = kind == Some("object") && s.get("properties").is_none();
                    if kind == Some("array") || is_map || is_any {
                        return Err(format!(
                            "{here}: an optional property must not be an array, a map or any JSON"
                        ));
                    }
                }
            }
            for r in &required {
                if !props.contains_key(*r) {
                    return Err(format!("{at}: required {r} is not a property"));
                }
            }
        }
        if let Some(add) = obj.get("additionalProperties").filter(|v| v.is_object()) {
            self.check_schema(&format!("{at}{{}}"), add, false, titles)?;
        }
        if let Some(Value::Array(variants)) = obj.get("oneOf") {
            let all_refs = variants.iter().all(|v| v.get("$ref").is_some());
            if all_refs {
                for v in variants {
                    self.check_schema(at, v, false, titles)?;
                }
            } else {
                let mut tag_name: Option<String> = None;
                for v in variants {
                    let title = v
                        .get("title")
                        .and_then(Value::as_str)
                        .ok_or_else(|| format!("{at}: every union variant needs a title"))?;
                    if !titles.insert(title.to_string()) {
                        return Err(format!("{at}: duplicate variant title {title}"));
                    }
                    let (tag, _) = variant_tag(v).ok_or_else(|| {
                        format!("{at}/{title}: a variant needs a required const tag property")
                    })?;
                    match &tag_name {
                        None => tag_name = Some(tag),
                        Some(t) if *t == tag => {}
                        Some(t) => return Err(format!("{at}: mixed tags {t} and {tag}")),
                    }
                    self.check_schema(&format!("{at}/{title}"), v, false, titles)?;
                }
            }
        }
        if let Some(Value::Array(all)) = obj.get("allOf") {
            for clause in all {
                correlation_clause(clause)
                    .ok_or_else(|| format!("{at}: allOf is only for if/then correlations"))?;
            }
        }
        for k in [
            "anyOf",
            "if",
            "then",
            "else",
            "patternProperties",
            "propertyNames",
            "format",
        ] {
            if obj.contains_key(k) {
                return Err(format!("{at}: {k} is not in the profile"));
            }
        }
        Ok(())
    }

    fn find_correlations(&self) -> Result<Vec<Correlation>, String> {
        let mut out = Vec::new();
        for (name, schema) in &self.defs {
            let Some(Value::Array(variants)) = schema.get("oneOf") else {
                continue;
            };
            for v in variants {
                let Some(Value::Array(all)) = v.get("allOf") else {
                    continue;
                };
                let title = v["title"].as_str().unwrap_or_default().to_string();
                let mut corr: Option<Correlation> = None;
                for clause in all {
                    let (sel, value, target, reference) =
                        correlation_clause(clause).ok_or("bad correlation")?;
                    let selector_type = v["properties"][&sel]
                        .get("$ref")
                        .and_then(Value::as_str)
                        .map(|r| self.ref_name(r))
                        .transpose()?
                        .ok_or_else(|| format!("{name}/{title}: the selector must be a $ref"))?;
                    let c = corr.get_or_insert_with(|| Correlation {
                        union: name.clone(),
                        variant: title.clone(),
                        selector: sel.clone(),
                        selector_type,
                        target: target.clone(),
                        pairs: Vec::new(),
                    });
                    if c.selector != sel || c.target != target {
                        return Err(format!(
                            "{name}/{title}: one selector and target per variant"
                        ));
                    }
                    c.pairs.push((value, self.ref_name(&reference)?));
                }
                if let Some(c) = corr {
                    // Every selector value must be covered exactly once.
                    let values = enum_values(&self.defs[&c.selector_type]).ok_or_else(|| {
                        format!("{}: selector must be a string enum", c.selector_type)
                    })?;
                    let covered: Vec<&str> = c.pairs.iter().map(|(v, _)| v.as_str()).collect();
                    let mut sorted = covered.clone();
                    sorted.sort_unstable();
                    sorted.dedup();
                    if sorted.len() != covered.len() {
                        return Err(format!(
                            "{name}/{title}: a selector value is correlated twice"
                        ));
                    }
                    for value in &values {
                        if !covered.contains(&value.as_str()) {
                            return Err(format!("{name}/{title}: {value} has no correlation"));
                        }
                    }
                    out.push(c);
                }
            }
        }
        Ok(out)
    }
}

/// The `$ref` of a nullable value: `oneOf: [{$ref}, {type: null}]` (nothing
/// else beside it but a description).
pub fn nullable(schema: &Value) -> Option<&str> {
    let obj = schema.as_object()?;
    if obj.keys().any(|k| k != "oneOf" && k != "description") {
        return None;
    }
    match obj.get("oneOf")?.as_array()?.as_slice() {
        [reference, null] if null == &serde_json::json!({ "type": "null" }) => {
            let reference = reference.as_object()?;
            (reference.len() == 1).then_some(())?;
            reference.get("$ref")?.as_str()
        }
        _ => None,
    }
}

/// The tag property and value of a union variant.
pub fn variant_tag(variant: &Value) -> Option<(String, String)> {
    let props = variant.get("properties")?.as_object()?;
    let required: Vec<&str> = variant
        .get("required")?
        .as_array()?
        .iter()
        .filter_map(Value::as_str)
        .collect();
    if variant.get("additionalProperties") != Some(&Value::Bool(false)) {
        return None;
    }
    props.iter().find_map(|(k, s)| {
        let c = s.get("const")?.as_str()?;
        required
            .contains(&k.as_str())
            .then(|| (k.clone(), c.to_string()))
    })
}

/// The string values of an `enum` schema.
pub fn enum_values(schema: &Value) -> Option<Vec<String>> {
    schema
        .get("enum")?
        .as_array()?
        .iter()
        .map(|v| v.as_str().map(str::to_string))
        .collect()
}

/// `(selector, value, target, $ref)` of one `if/then` clause.
fn correlation_clause(clause: &Value) -> Option<(String, String, String, String)> {
    let obj = clause.as_object()?;
    if obj.len() != 2 {
        return None;
    }
    let cond = obj.get("if")?.as_object()?;
    let (sel, s) = single(cond.get("properties")?.as_object()?)?;
    let value = s.get("const")?.as_str()?.to_string();
    let req = cond.get("required")?.as_array()?;
    if req.len() != 1 || req[0].as_str() != Some(sel.as_str()) || cond.len() != 2 {
        return None;
    }
    let then = obj.get("then")?.as_object()?;
    if then.len() != 1 {
        return None;
    }
    let (target, t) = single(then.get("properties")?.as_object()?)?;
    let reference = t.get("$ref")?.as_str()?.to_string();
    Some((sel, value, target, reference))
}

fn single(map: &Map<String, Value>) -> Option<(String, &Value)> {
    if map.len() != 1 {
        return None;
    }
    map.iter().next().map(|(k, v)| (k.clone(), v))
}
