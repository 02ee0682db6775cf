//! The resources screen's state: the server's `resource.list` rows, the
//! selected resource and its `resource.get` view, and when to read them
//! again.
//!
//! Invariants:
//! - What is held is the server's answers as given; nothing here decides a
//!   resource's readiness, queue or effects.
//! - The detail is the selected resource's: an answer for any other
//!   resource is dropped, and a new selection clears the old detail (its
//!   own read is asked for at once).
//! - Reads repeat every [`REFRESH_MS`] while the screen is shown, at most
//!   one list read and one detail read outstanding (a slow server gets no
//!   pile-up, and nothing is asked while another screen is shown).
//! - A failed read is one line; the rows or the detail shown before it
//!   stay (the next answer replaces the line).

use protocol::generated::types::{ResourceListRow, ResourceListRowReady, ResourceView};

use crate::source::Command;

/// How often the shown screen reads the resources again.
pub const REFRESH_MS: u64 = 1000;

/// The empty state's line: how to make a resource.
pub const EMPTY_LINE: &str =
    "No resources yet: `pi-workflows apply <controller> <key> <spec.json>`";

/// A resource's identity: (controller, key).
pub type ResourceId = (String, String);

/// The resources screen's state.
#[derive(Debug, Default)]
pub struct Resources {
    /// The last `resource.list` rows (`None`: not read yet).
    pub rows: Option<Vec<ResourceListRow>>,
    /// The last list read's failure, one line.
    pub list_error: Option<String>,
    /// The selected resource.
    pub cursor: Option<ResourceId>,
    /// The selected resource's last `resource.get` view.
    pub detail: Option<Box<ResourceView>>,
    /// The selected resource's last read failure, one line.
    pub detail_error: Option<String>,
    list_pending: bool,
    detail_pending: Option<ResourceId>,
    next_refresh_ms: u64,
}

fn id_of(row: &ResourceListRow) -> ResourceId {
    (row.controller.to_string(), row.key.to_string())
}

impl Resources {
    /// The index of the cursor among the rows.
    pub fn cursor_index(&self) -> Option<usize> {
        let cursor = self.cursor.as_ref()?;
        self.rows
            .as_ref()?
            .iter()
            .position(|row| &id_of(row) == cursor)
    }

    /// The screen was opened: read everything now.
    pub fn open(&mut self) {
        self.next_refresh_ms = 0;
    }

    /// The reads that are due at `now_ms` (called on every tick while the
    /// screen is shown).
    pub fn due(&mut self, now_ms: u64) -> Vec<Command> {
        if now_ms < self.next_refresh_ms {
            return Vec::new();
        }
        self.next_refresh_ms = now_ms + REFRESH_MS;
        let mut commands = Vec::new();
        if !self.list_pending {
            self.list_pending = true;
            commands.push(Command::ListResources);
        }
        commands.extend(self.read_detail());
        commands
    }

    /// The selected resource's read, unless one is outstanding.
    fn read_detail(&mut self) -> Option<Command> {
        let cursor = self.cursor.clone()?;
        if self.detail_pending.as_ref() == Some(&cursor) {
            return None;
        }
        self.detail_pending = Some(cursor.clone());
        Some(Command::GetResource {
            controller: cursor.0,
            key: cursor.1,
        })
    }

    /// Selects `cursor`; a new selection drops the old detail and asks for
    /// its own.
    fn select(&mut self, cursor: Option<ResourceId>) -> Option<Command> {
        if self.cursor == cursor {
            return None;
        }
        self.cursor = cursor;
        self.detail = None;
        self.detail_error = None;
        self.read_detail()
    }

    /// The answer of a list read; the commands it makes necessary (the
    /// detail of a new selection).
    pub fn apply_list(&mut self, result: Result<Vec<ResourceListRow>, String>) -> Vec<Command> {
        self.list_pending = false;
        match result {
            Ok(rows) => {
                self.list_error = None;
                let keep = self
                    .cursor
                    .as_ref()
                    .is_some_and(|cursor| rows.iter().any(|row| &id_of(row) == cursor));
                let cursor = if keep {
                    self.cursor.clone()
                } else {
                    rows.first().map(id_of)
                };
                self.rows = Some(rows);
                self.select(cursor).into_iter().collect()
            }
            Err(line) => {
                self.list_error = Some(line);
                Vec::new()
            }
        }
    }

    /// The answer of a detail read for (controller, key).
    pub fn apply_detail(
        &mut self,
        controller: String,
        key: String,
        result: Result<Box<ResourceView>, String>,
    ) {
        let id = (controller, key);
        if self.detail_pending.as_ref() == Some(&id) {
            self.detail_pending = None;
        }
        if self.cursor.as_ref() != Some(&id) {
            return;
        }
        match result {
            Ok(view) => {
                self.detail = Some(view);
                self.detail_error = None;
            }
            Err(line) => self.detail_error = Some(line),
        }
    }

    /// Moves the selection by `delta` rows (clamped); the commands it
    /// makes necessary.
    pub fn move_cursor(&mut self, delta: isize) -> Vec<Command> {
        let Some(rows) = self.rows.as_ref().filter(|rows| !rows.is_empty()) else {
            return Vec::new();
        };
        let at = self.cursor_index().unwrap_or(0) as isize;
        let to = (at.saturating_add(delta)).clamp(0, rows.len() as isize - 1) as usize;
        let cursor = Some(id_of(&rows[to]));
        self.select(cursor).into_iter().collect()
    }
}

/// The glyph and words of a resource's Ready condition (absent: no
/// reconcile has set one yet).
pub fn ready_cell(ready: Option<ResourceListRowReady>) -> &'static str {
    match ready {
        Some(ResourceListRowReady::True) => "✓ ready",
        Some(ResourceListRowReady::False) => "✗ not ready",
        Some(ResourceListRowReady::Unknown) => "? unknown",
        None => "○ no Ready",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(controller: &str, key: &str) -> ResourceListRow {
        serde_json::from_value(serde_json::json!({
            "controller": controller, "key": key, "resourceVersion": 1, "generation": 1,
            "observedGeneration": 0, "deleting": false, "consecutiveErrors": 0,
            "updatedAtMs": 1,
        }))
        .unwrap()
    }

    fn view(controller: &str, key: &str) -> Box<ResourceView> {
        Box::new(
            serde_json::from_value(serde_json::json!({
                "controller": controller, "key": key, "uid": "u", "resourceVersion": 1,
                "generation": 1, "spec": {}, "finalizers": [], "createdAtMs": 1,
                "updatedAtMs": 1, "effects": [], "childWorkflows": [], "events": [],
                "status": {"observedGeneration": 0, "conditions": [],
                           "controllerStatus": null, "workflowRun": null},
            }))
            .unwrap(),
        )
    }

    fn get(controller: &str, key: &str) -> Command {
        Command::GetResource {
            controller: controller.into(),
            key: key.into(),
        }
    }

    #[test]
    fn reads_repeat_each_second_with_one_outstanding() {
        let mut resources = Resources::default();
        resources.open();
        assert_eq!(resources.due(5_000), vec![Command::ListResources]);
        // Not due yet, and the list read is outstanding.
        assert_eq!(resources.due(5_500), vec![]);
        assert_eq!(resources.due(6_000), vec![]);
        let follow = resources.apply_list(Ok(vec![row("c", "a"), row("c", "b")]));
        assert_eq!(follow, vec![get("c", "a")]);
        assert_eq!(resources.due(7_000), vec![Command::ListResources]);
        resources.apply_detail("c".into(), "a".into(), Ok(view("c", "a")));
        resources.apply_list(Ok(vec![row("c", "a")]));
        assert_eq!(
            resources.due(8_000),
            vec![Command::ListResources, get("c", "a")]
        );
    }

    #[test]
    fn the_detail_is_only_the_selected_resources() {
        let mut resources = Resources::default();
        resources.apply_list(Ok(vec![row("c", "a"), row("c", "b")]));
        assert_eq!(resources.move_cursor(1), vec![get("c", "b")]);
        // The answer for the old selection arrives late: dropped.
        resources.apply_detail("c".into(), "a".into(), Ok(view("c", "a")));
        assert!(resources.detail.is_none());
        resources.apply_detail("c".into(), "b".into(), Ok(view("c", "b")));
        assert_eq!(resources.detail.as_ref().unwrap().key.as_str(), "b");
        // Moving away clears it at once.
        assert_eq!(resources.move_cursor(-1), vec![get("c", "a")]);
        assert!(resources.detail.is_none());
    }

    #[test]
    fn a_failed_read_is_one_line_and_keeps_the_rows() {
        let mut resources = Resources::default();
        resources.apply_list(Ok(vec![row("c", "a")]));
        resources.apply_list(Err("the server went away".into()));
        assert_eq!(resources.rows.as_ref().unwrap().len(), 1);
        assert_eq!(
            resources.list_error.as_deref(),
            Some("the server went away")
        );
        resources.apply_list(Ok(vec![row("c", "a")]));
        assert_eq!(resources.list_error, None);
    }
}
