use super::*;
use alloc::string::ToString;
use alloc::vec::Vec;
use proptest::prelude::*;
use serde_json::json;

fn object(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        other => panic!("not an object: {other}"),
    }
}

fn at(revision: u64, value: Value) -> ScopeSettings {
    ScopeSettings {
        revision,
        value: object(value),
    }
}

fn changed(update: Result<Update, SettingsRejection>) -> ScopeSettings {
    match update {
        Ok(Update::Changed(settings)) => settings,
        other => panic!("expected a change, got {other:?}"),
    }
}

#[test]
fn a_patch_merges_key_by_key_and_null_deletes() {
    let current = at(
        3,
        json!({"theme": "dark", "editor": {"tabs": 2, "wrap": true}, "old": 1}),
    );
    let patch = object(json!({"editor": {"tabs": 4, "wrap": null}, "old": null, "new": [1, 2]}));
    let next = changed(update(&current, &patch));
    assert_eq!(
        Value::Object(next.value),
        json!({"theme": "dark", "editor": {"tabs": 4}, "new": [1, 2]})
    );
    assert_eq!(next.revision, 4, "one accepted change is one revision");
}

#[test]
fn the_rfc_7396_examples_hold() {
    // RFC 7396 appendix A, for object targets and object patches.
    let cases = [
        (json!({"a": "b"}), json!({"a": "c"}), json!({"a": "c"})),
        (
            json!({"a": "b"}),
            json!({"b": "c"}),
            json!({"a": "b", "b": "c"}),
        ),
        (json!({"a": "b"}), json!({"a": null}), json!({})),
        (
            json!({"a": "b", "b": "c"}),
            json!({"a": null}),
            json!({"b": "c"}),
        ),
        (json!({"a": ["b"]}), json!({"a": "c"}), json!({"a": "c"})),
        (json!({"a": "c"}), json!({"a": ["b"]}), json!({"a": ["b"]})),
        (
            json!({"a": {"b": "c"}}),
            json!({"a": {"b": "d", "c": null}}),
            json!({"a": {"b": "d"}}),
        ),
        (
            json!({"a": [{"b": "c"}]}),
            json!({"a": [1]}),
            json!({"a": [1]}),
        ),
        (
            json!({"e": null}),
            json!({"a": 1}),
            json!({"e": null, "a": 1}),
        ),
        (
            json!({"a": "foo"}),
            json!({"a": {"bb": {"ccc": null}}}),
            json!({"a": {"bb": {}}}),
        ),
        (
            json!({}),
            json!({"a": {"bb": {"ccc": null}}}),
            json!({"a": {"bb": {}}}),
        ),
    ];
    for (target, patch, expected) in cases {
        let mut value = object(target.clone());
        merge_object(&mut value, &object(patch.clone()));
        assert_eq!(Value::Object(value), expected, "{target} + {patch}");
    }
}

#[test]
fn a_patch_that_changes_nothing_keeps_the_revision() {
    let current = at(5, json!({"theme": "dark"}));
    for patch in [
        json!({}),
        json!({"theme": "dark"}),
        json!({"missing": null}),
    ] {
        assert_eq!(update(&current, &object(patch)), Ok(Update::Unchanged));
    }
}

#[test]
fn the_first_change_of_a_scope_is_revision_one() {
    let next = changed(update(&ScopeSettings::default(), &object(json!({"a": 1}))));
    assert_eq!(next.revision, 1);
}

#[test]
fn a_value_over_the_key_bound_is_refused() {
    let mut patch = Map::new();
    for index in 0..MAX_KEYS {
        patch.insert(format!("k{index}"), json!(index));
    }
    let full = changed(update(&ScopeSettings::default(), &patch));
    assert_eq!(key_count(&full.value), MAX_KEYS);
    // Nested keys count too.
    let over = object(json!({"nested": {"one": 1}}));
    assert_eq!(
        update(&full, &over),
        Err(SettingsRejection::TooManyKeys { keys: MAX_KEYS + 2 })
    );
    // Deleting one key makes room for another.
    let swap = object(json!({"k0": null, "other": true}));
    assert_eq!(changed(update(&full, &swap)).revision, 2);
}

#[test]
fn a_value_over_the_byte_bound_is_refused() {
    let big = "x".repeat(MAX_VALUE_BYTES);
    let patch = object(json!({ "note": big }));
    let refused = update(&ScopeSettings::default(), &patch);
    assert!(
        matches!(refused, Err(SettingsRejection::TooLarge { bytes }) if bytes > MAX_VALUE_BYTES),
        "{refused:?}"
    );
    let fits = object(json!({ "note": "x".repeat(MAX_VALUE_BYTES - 20) }));
    assert_eq!(
        changed(update(&ScopeSettings::default(), &fits)).revision,
        1
    );
}

#[test]
fn the_last_revision_is_not_passed() {
    let current = at(MAX_REVISION, json!({}));
    assert_eq!(
        update(&current, &object(json!({"a": 1}))),
        Err(SettingsRejection::RevisionExhausted)
    );
}

#[test]
fn a_scope_key_names_the_project_only_for_the_project_scope() {
    assert_eq!(scope_key(Scope::User, None), Ok(ScopeKey::user()));
    assert_eq!(
        scope_key(Scope::Project, Some("p1")).map(|key| key.as_str().to_string()),
        Ok(String::from("project:p1"))
    );
    assert_eq!(
        scope_key(Scope::Project, None),
        Err(SettingsRejection::ProjectRequired)
    );
    assert_eq!(
        scope_key(Scope::User, Some("p1")),
        Err(SettingsRejection::ProjectForUserScope)
    );
}

#[test]
fn a_continuation_keeps_its_parents_binding() {
    let parent = Binding {
        user: 2,
        project: 1,
    };
    let now = Binding {
        user: 5,
        project: 3,
    };
    assert_eq!(bind(Some(parent), now), parent);
    assert_eq!(bind(None, now), now);
}

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        (0u32..4).prop_map(|n| json!(n)),
        "[ab]{0,2}".prop_map(Value::String),
    ]
}

fn patch() -> impl Strategy<Value = Map<String, Value>> {
    let value = leaf().prop_recursive(3, 16, 3, |inner| {
        proptest::collection::btree_map("[abc]", inner, 0..3)
            .prop_map(|map| Value::Object(map.into_iter().collect()))
    });
    proptest::collection::btree_map("[abcd]", value, 0..4).prop_map(|map| map.into_iter().collect())
}

proptest! {
    /// Over any sequence of patches: the revision counts exactly the
    /// patches that changed the value, and applying a patch twice changes
    /// nothing the second time (a merge patch is idempotent).
    #[test]
    fn revisions_count_changes_and_a_repeated_patch_changes_nothing(
        patches in proptest::collection::vec(patch(), 1..12)
    ) {
        let mut settings = ScopeSettings::default();
        let mut changes = 0u64;
        for patch in &patches {
            let before = settings.clone();
            match update(&settings, patch).unwrap() {
                Update::Changed(next) => {
                    prop_assert_ne!(&next.value, &before.value);
                    prop_assert_eq!(next.revision, before.revision + 1);
                    changes += 1;
                    settings = next;
                }
                Update::Unchanged => {
                    let mut merged = before.value.clone();
                    merge_object(&mut merged, patch);
                    prop_assert_eq!(&merged, &before.value);
                }
            }
            prop_assert_eq!(update(&settings, patch).unwrap(), Update::Unchanged);
            let nulls: Vec<&String> = patch.iter().filter(|(_, v)| v.is_null()).map(|(k, _)| k).collect();
            for key in nulls {
                prop_assert!(!settings.value.contains_key(key));
            }
        }
        prop_assert_eq!(settings.revision, changes);
    }
}
