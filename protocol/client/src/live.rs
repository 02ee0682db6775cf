//! A client-side live run view: the snapshot a subscription delivered plus
//! the patches after it.
//!
//! Invariants:
//! - A patch applies only to the exact revision it names as its base; any
//!   other base is refused, so the holder never shows a view that mixes two
//!   revisions (it resubscribes from its revision and gets a snapshot or the
//!   missing patches).
//! - Operations are the server's four: `add`, `replace`, `remove` (JSON
//!   pointer into an object or array) and `append` (push onto an array).
//! - A refused patch leaves the view unchanged.
//!
//! The TypeScript `LiveRunView` is the same fold; `sdk-ts/test/parity.test.ts`
//! follows one run with both and compares every revision.

use protocol::generated::types::ClientEvent;
use serde_json::Value;

/// Why an event could not be applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LiveError {
    /// The patch's base is not the view's revision.
    BaseMismatch { view: Option<u64>, base: u64 },
    /// An operation's path does not exist or has the wrong shape.
    BadOperation(String),
    /// The event is not a run-view snapshot or patch.
    NotRunView,
}

/// The view a subscriber holds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LiveView {
    view: Option<Value>,
}

impl LiveView {
    /// No view yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The current view, once a snapshot arrived.
    pub fn view(&self) -> Option<&Value> {
        self.view.as_ref()
    }

    /// The revision of the current view.
    pub fn revision(&self) -> Option<u64> {
        self.view
            .as_ref()
            .and_then(|view| view.get("revision"))
            .and_then(Value::as_u64)
    }

    /// Applies one typed event (see [`LiveView::apply`]).
    pub fn apply_event(&mut self, event: &ClientEvent) -> Result<(), LiveError> {
        let event = serde_json::to_value(event).map_err(|_| LiveError::NotRunView)?;
        self.apply(&event)
    }

    /// Applies one event payload (`runViewSnapshot` or `runViewPatch`).
    pub fn apply(&mut self, event: &Value) -> Result<(), LiveError> {
        match event.get("kind").and_then(Value::as_str) {
            Some("runViewSnapshot") => {
                let view = event.get("view").ok_or(LiveError::NotRunView)?;
                self.view = Some(view.clone());
                Ok(())
            }
            Some("runViewPatch") => {
                let base = event
                    .get("baseRevision")
                    .and_then(Value::as_u64)
                    .ok_or(LiveError::NotRunView)?;
                let current = self.revision();
                let Some(view) = self.view.as_ref().filter(|_| current == Some(base)) else {
                    return Err(LiveError::BaseMismatch {
                        view: current,
                        base,
                    });
                };
                let ops = event
                    .get("ops")
                    .and_then(Value::as_array)
                    .ok_or(LiveError::NotRunView)?;
                let mut patched = view.clone();
                apply_patch(&mut patched, ops)?;
                self.view = Some(patched);
                Ok(())
            }
            _ => Err(LiveError::NotRunView),
        }
    }
}

/// Applies `ops` to `document` in order.
pub fn apply_patch(document: &mut Value, ops: &[Value]) -> Result<(), LiveError> {
    for op in ops {
        let kind = op.get("op").and_then(Value::as_str).unwrap_or_default();
        let path = op.get("path").and_then(Value::as_str).unwrap_or_default();
        let bad = || LiveError::BadOperation(format!("{kind} {path}"));
        let value = op.get("value").cloned();
        if kind == "append" {
            let target = document.pointer_mut(path).ok_or_else(bad)?;
            target
                .as_array_mut()
                .ok_or_else(bad)?
                .push(value.ok_or_else(bad)?);
            continue;
        }
        let (parent_path, last) = path.rsplit_once('/').ok_or_else(bad)?;
        let key = last.replace("~1", "/").replace("~0", "~");
        let parent = document.pointer_mut(parent_path).ok_or_else(bad)?;
        match (kind, parent) {
            ("add" | "replace", Value::Object(map)) => {
                if kind == "replace" && !map.contains_key(&key) {
                    return Err(bad());
                }
                map.insert(key, value.ok_or_else(bad)?);
            }
            ("remove", Value::Object(map)) => {
                map.remove(&key).ok_or_else(bad)?;
            }
            ("replace", Value::Array(items)) => {
                let slot = key
                    .parse::<usize>()
                    .ok()
                    .and_then(|index| items.get_mut(index))
                    .ok_or_else(bad)?;
                *slot = value.ok_or_else(bad)?;
            }
            ("add", Value::Array(items)) => {
                let index = if key == "-" {
                    items.len()
                } else {
                    key.parse::<usize>().map_err(|_| bad())?
                };
                if index > items.len() {
                    return Err(bad());
                }
                items.insert(index, value.ok_or_else(bad)?);
            }
            ("remove", Value::Array(items)) => {
                let index = key.parse::<usize>().map_err(|_| bad())?;
                if index >= items.len() {
                    return Err(bad());
                }
                items.remove(index);
            }
            _ => return Err(bad()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn snapshot(revision: u64) -> Value {
        json!({ "kind": "runViewSnapshot", "view": {
            "revision": revision, "display": { "status": "running" },
            "steps": { "items": [{ "seq": 1 }], "total": 1 }, "nodes": [{ "id": "a" }] } })
    }

    #[test]
    fn patches_apply_in_order_on_their_base() {
        let mut live = LiveView::new();
        live.apply(&snapshot(3)).unwrap();
        live.apply(&json!({ "kind": "runViewPatch", "baseRevision": 3, "ops": [
            { "op": "replace", "path": "/display/status", "value": "paused" },
            { "op": "append", "path": "/steps/items", "value": { "seq": 2 } },
            { "op": "replace", "path": "/steps/total", "value": 2 },
            { "op": "add", "path": "/title", "value": "t" },
            { "op": "replace", "path": "/nodes/0", "value": { "id": "a", "state": "completed" } },
            { "op": "replace", "path": "/revision", "value": 4 },
        ] }))
        .unwrap();
        let view = live.view().unwrap();
        assert_eq!(view["display"]["status"], "paused");
        assert_eq!(view["steps"]["items"][1]["seq"], 2);
        assert_eq!(view["nodes"][0]["state"], "completed");
        assert_eq!(live.revision(), Some(4));
        live.apply(&json!({ "kind": "runViewPatch", "baseRevision": 4, "ops": [
            { "op": "remove", "path": "/title" }, { "op": "replace", "path": "/revision", "value": 5 } ] }))
            .unwrap();
        assert!(live.view().unwrap().get("title").is_none());
    }

    #[test]
    fn a_patch_on_another_base_is_refused_and_changes_nothing() {
        let mut live = LiveView::new();
        let patch = json!({ "kind": "runViewPatch", "baseRevision": 3, "ops": [
            { "op": "replace", "path": "/revision", "value": 4 } ] });
        assert_eq!(
            live.apply(&patch),
            Err(LiveError::BaseMismatch {
                view: None,
                base: 3
            })
        );
        live.apply(&snapshot(2)).unwrap();
        let before = live.clone();
        assert_eq!(
            live.apply(&patch),
            Err(LiveError::BaseMismatch {
                view: Some(2),
                base: 3
            })
        );
        assert_eq!(live, before);
    }

    #[test]
    fn a_bad_operation_is_refused_and_changes_nothing() {
        let mut live = LiveView::new();
        live.apply(&snapshot(1)).unwrap();
        let before = live.clone();
        for op in [
            json!({ "op": "replace", "path": "/missing", "value": 1 }),
            json!({ "op": "replace", "path": "/nodes/7", "value": 1 }),
            json!({ "op": "append", "path": "/display", "value": 1 }),
            json!({ "op": "remove", "path": "/nodes/3" }),
            json!({ "op": "move", "path": "/revision" }),
        ] {
            let patch = json!({ "kind": "runViewPatch", "baseRevision": 1, "ops": [
                { "op": "replace", "path": "/revision", "value": 2 }, op ] });
            assert!(
                matches!(live.apply(&patch), Err(LiveError::BadOperation(_))),
                "{patch}"
            );
            assert_eq!(live, before);
        }
    }
}
