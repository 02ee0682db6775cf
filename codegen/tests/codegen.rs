//! The checked-in generated files match the schemas, and the schema
//! profile check rejects shapes the generators cannot keep in agreement.
//!
//! `generated_files_are_up_to_date` runs the ajv standalone compiler, so it
//! needs node and `sdk-ts/node_modules` (`npm ci` in `sdk-ts`;
//! `scripts/test-all.sh` does that first).

use std::path::PathBuf;

use codegen::schema::Bundle;

#[test]
fn generated_files_are_up_to_date() {
    let root = codegen::repo_root();
    let outputs = codegen::generate(&root).expect("codegen runs");
    assert_eq!(outputs.len(), 9);
    let stale = codegen::stale(&root, &outputs);
    assert!(
        stale.is_empty(),
        "stale generated files (run `cargo run -p codegen`): {stale:?}"
    );
    for o in &outputs {
        assert!(
            o.contents.starts_with(&format!("// {}", codegen::HEADER)),
            "{} lacks the header",
            o.path.display()
        );
    }
}

/// A copy of the real schemas with one definition replaced.
fn with_def(file: &str, name: &str, schema: serde_json::Value) -> Result<Bundle, String> {
    let src = codegen::repo_root().join("protocol");
    let dir: PathBuf =
        std::env::temp_dir().join(format!("codegen-profile-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for stem in codegen::schema::FILES {
        let mut doc: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(src.join(format!("{stem}.v1.schema.json"))).unwrap(),
        )
        .unwrap();
        if stem == file {
            doc["$defs"][name] = schema.clone();
        }
        std::fs::write(dir.join(format!("{stem}.v1.schema.json")), doc.to_string()).unwrap();
    }
    let result = Bundle::load(&dir);
    std::fs::remove_dir_all(&dir).unwrap();
    result
}

#[test]
fn the_real_schemas_are_in_the_profile() {
    let bundle = Bundle::load(&codegen::repo_root().join("protocol")).expect("schemas load");
    let c = bundle
        .correlations
        .iter()
        .map(|c| (c.variant.as_str(), c.target.as_str(), c.pairs.len()))
        .collect::<Vec<_>>();
    assert_eq!(
        c,
        vec![("Request", "payload", 41), ("Response", "receipt", 41)]
    );
}

#[test]
fn the_profile_check_rejects_what_the_generators_cannot_keep_in_agreement() {
    let uncapped =
        serde_json::json!({"type": "integer", "minimum": 0, "maximum": 9007199254740992_u64});
    assert!(
        with_def("common", "Revision", uncapped)
            .unwrap_err()
            .contains("2^53-1")
    );
    let optional_array = serde_json::json!({"type":"object","additionalProperties":false,"required":[],
        "properties":{"xs":{"type":"array","items":{"type":"string"}}}});
    assert!(
        with_def("client", "EmptyPayload", optional_array)
            .unwrap_err()
            .contains("optional property")
    );
    let untitled = serde_json::json!({"oneOf":[{"type":"object","additionalProperties":false,"required":["kind"],
        "properties":{"kind":{"const":"a"}}}]});
    assert!(
        with_def("client", "SubscriptionTarget", untitled)
            .unwrap_err()
            .contains("title")
    );
    let inline_int = serde_json::json!({"type":"object","additionalProperties":false,"required":["n"],
        "properties":{"n":{"type":"integer","minimum":0,"maximum":5}}});
    assert!(
        with_def("client", "EmptyPayload", inline_int)
            .unwrap_err()
            .contains("$defs")
    );
    let nullable = serde_json::json!({"type": ["string", "null"]});
    assert!(
        with_def("common", "Title", nullable)
            .unwrap_err()
            .contains("type arrays")
    );
    // A nullable property must be required: absent and null would be one
    // Rust `None`.
    let optional_nullable = serde_json::json!({"type":"object","additionalProperties":false,"required":[],
        "properties":{"id":{"oneOf":[{"$ref":"common.v1.schema.json#/$defs/MessageId"},{"type":"null"}]}}});
    assert!(
        with_def("client", "EmptyPayload", optional_nullable)
            .unwrap_err()
            .contains("nullable property must be required")
    );
    let null_beside_two = serde_json::json!({"type":"object","additionalProperties":false,"required":["id"],
        "properties":{"id":{"oneOf":[{"$ref":"common.v1.schema.json#/$defs/MessageId"},
            {"$ref":"common.v1.schema.json#/$defs/RunId"},{"type":"null"}]}}});
    assert!(with_def("client", "EmptyPayload", null_beside_two).is_err());
}

/// The reply result types of the real schemas, and an `x-replyResult` that
/// names no closed object is refused.
#[test]
fn reply_results_name_closed_objects_of_the_schemas() {
    let bundle = Bundle::load(&codegen::repo_root().join("protocol")).expect("schemas load");
    let results = codegen::wire::reply_results(&bundle).expect("the annotation is in the profile");
    assert_eq!(
        results
            .iter()
            .map(|(message, names)| format!("{message}: {}", names.join(" | ")))
            .collect::<Vec<_>>(),
        [
            "node.update: NodeUpdateResult",
            "interaction.requested: InteractionRequestResult",
            "notification.requested: NotificationResult",
            "effect.reserve: EffectReservation | EffectAdoption",
            "effect.settle: EffectSettlement | EffectAdoption",
        ]
    );
    let mut message = bundle.defs["RunnerMessage"].clone();
    message["oneOf"][0]["x-replyResult"] = serde_json::json!(["SettleState"]);
    let planted = with_def("runner", "RunnerMessage", message).expect("the schemas load");
    assert!(
        codegen::wire::reply_results(&planted)
            .unwrap_err()
            .contains("names SettleState, not a closed object")
    );
}
