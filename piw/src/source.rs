//! The data-source boundary: everything piw shows arrives as a
//! [`SourceEvent`], and everything it asks for leaves as a [`Command`].
//!
//! Invariants:
//! - The screens are functions of these events only. A source delivers the
//!   server's documents as they are (typed by the protocol crate); piw never
//!   reads state any other way (no database, no files of the server).
//! - A source verifies content before it delivers it: a
//!   [`SourceEvent::Content`] with bytes means the bytes matched the
//!   reference's digest and length ([`verify_content`]).
//! - Every control leaves with the idempotency key of the one user action
//!   that confirmed it; the source sends it once (a later retry of the same
//!   action reuses the key, so the server adopts the stored receipt).
//! - Availability strings are the source's: piw shows them verbatim as one
//!   line and never adds a database message or falls back to anything.

use std::collections::VecDeque;

use protocol::generated::types::{
    ContentReference, Control, PageCollection, ResourceListRow, ResourceView, RunListRow, RunView,
    ViewPage,
};
use serde_json::Value;

/// Whether the server can be reached, in the source's own words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Availability {
    /// Connecting for the first time.
    Connecting,
    /// Connected; documents are current.
    Available,
    /// The server cannot be reached: one line that says how to start or
    /// install it. Documents on screen are kept but labelled disconnected.
    Unavailable(String),
    /// The server speaks another protocol or package version: one
    /// package-version line.
    VersionMismatch(String),
}

/// One thing the source tells piw.
#[derive(Clone, Debug, PartialEq)]
pub enum SourceEvent {
    /// The complete run list at one revision (the source assembled every
    /// page), newest first as the server orders it.
    RunList {
        revision: u64,
        rows: Vec<RunListRow>,
    },
    /// The complete current view of a watched run (snapshot plus patches,
    /// folded by the source); its revision is `view.revision`.
    RunView(Box<RunView>),
    /// A watched run does not exist: one line saying so.
    RunMissing { run_id: String, line: String },
    /// A frame of the watched run's subscription could not be folded into a
    /// run view (a patch that does not apply, or a document that is not a
    /// run view): the view piw holds is stale until the next
    /// [`SourceEvent::RunView`], and the source has asked the server for a
    /// fresh snapshot. `line` says what happened and what to do next.
    RunViewStale { run_id: String, line: String },
    /// One page of a run-view collection, as the server answered it.
    Page { run_id: String, page: ViewPage },
    /// A page could not be read: one line.
    PageFailed {
        run_id: String,
        collection: PageCollection,
        line: String,
    },
    /// Referenced content: the verified bytes, or one line saying why they
    /// are not available.
    Content {
        run_id: String,
        reference: ContentReference,
        result: Result<Vec<u8>, String>,
    },
    /// The server's reachability changed.
    Availability(Availability),
    /// The answer to [`Command::ListResources`]: the server's
    /// `resource.list` rows (by controller and key), or one line saying why
    /// they could not be read.
    ResourceList(Result<Vec<ResourceListRow>, String>),
    /// The answer to [`Command::GetResource`] for that resource: the
    /// server's `resource.get` view, or one line.
    Resource {
        controller: String,
        key: String,
        result: Result<Box<ResourceView>, String>,
    },
    /// The outcome of a control: the server's outcome word
    /// (`accepted`, `adopted`, `rejected`, …) and one line for the user.
    ControlResult {
        idempotency_key: String,
        control: Control,
        outcome: String,
        line: String,
    },
}

/// A control the user confirmed, ready to send.
#[derive(Clone, Debug, PartialEq)]
pub struct ControlRequest {
    pub run_id: String,
    pub control: Control,
    /// The client.v1 operation the control maps to.
    pub operation: &'static str,
    /// The view revision the user saw when they confirmed.
    pub expected_revision: u64,
    /// One key per user action.
    pub idempotency_key: String,
    /// The operation's payload (`{}` for pause, resume, cancel, restart,
    /// activate; `{"answer": …}` for a checkpoint answer; the decision,
    /// request digest, choice, text and source for a decision answer).
    pub payload: Value,
}

/// One thing piw asks of the source.
#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    /// Keep the run list current.
    WatchRuns,
    /// Keep this run's view current (the source drops the previously
    /// watched run's pages, contents and subscription).
    WatchRun { run_id: String },
    /// Stop watching this run.
    UnwatchRun { run_id: String },
    /// Read one page of a collection at the view revision piw holds.
    FetchPage {
        run_id: String,
        collection: PageCollection,
        cursor: Option<String>,
        revision: u64,
    },
    /// Read and verify referenced content of a run.
    FetchContent {
        run_id: String,
        reference: ContentReference,
    },
    /// Send a confirmed control.
    Control(ControlRequest),
    /// Read the resources once (`resource.list`; read-only).
    ListResources,
    /// Read one resource once (`resource.get`; read-only).
    GetResource { controller: String, key: String },
}

/// Where piw's events come from and where its commands go.
pub trait Source {
    /// Hands over commands (in order).
    fn send(&mut self, command: Command);
    /// The next event, if one is ready (never blocks).
    fn try_next(&mut self) -> Option<SourceEvent>;
}

/// Reads `bytes` as the content behind `reference` the way the client
/// library does (the protocol crate's [`Assembler`](protocol::content::Assembler):
/// length and SHA-256 digest), as one part.
pub fn verified(reference: &ContentReference, bytes: &[u8]) -> Result<Vec<u8>, String> {
    use base64::Engine as _;
    let reference =
        serde_json::to_value(reference).map_err(|_| "a reference of another shape".to_owned())?;
    let failed = |failure: protocol::content::ContentFailure| {
        format!("{}; it was not shown", failure.message())
    };
    let mut assembler =
        protocol::content::Assembler::new(&reference, None, u64::MAX).map_err(failed)?;
    if assembler.next_request().is_some() {
        let data = base64::engine::general_purpose::STANDARD.encode(bytes);
        assembler
            .accept(protocol::content::Part {
                reference: &reference,
                offset: 0,
                data: &data,
                last: true,
                digest: None,
            })
            .map_err(failed)?;
    }
    assembler.finish().map_err(failed)
}

/// A source for tests and offline documents: events are queued by the
/// caller, commands are recorded, and content is served from a store of
/// byte strings and verified like a real source does.
#[derive(Debug, Default)]
pub struct FakeSource {
    events: VecDeque<SourceEvent>,
    /// Every command piw sent, in order.
    pub sent: Vec<Command>,
    /// Content the fake can serve (any bytes; verified on the way out).
    pub contents: Vec<Vec<u8>>,
    /// Pages the fake answers `FetchPage` with, by run and collection
    /// (the first matching page; absent: an empty page).
    pub pages: Vec<(String, ViewPage)>,
    /// Whether `FetchContent`, `FetchPage` and the resource reads are
    /// answered at once.
    pub answer_reads: bool,
    /// What `ListResources` is answered with (absent: a failure line).
    pub resources: Option<Vec<ResourceListRow>>,
    /// The views `GetResource` is answered with, by controller and key
    /// (absent: a not-found line).
    pub resource_views: Vec<ResourceView>,
}

impl FakeSource {
    /// A fake that answers reads from its stores.
    pub fn new() -> Self {
        Self {
            answer_reads: true,
            ..Self::default()
        }
    }

    /// Queues an event.
    pub fn push(&mut self, event: SourceEvent) {
        self.events.push_back(event);
    }

    fn answer(&mut self, command: &Command) {
        if !self.answer_reads {
            return;
        }
        match command {
            Command::FetchContent { run_id, reference } => {
                let found = self
                    .contents
                    .iter()
                    .find(|bytes| {
                        protocol::content::digest_text(bytes) == reference.digest.as_str()
                    })
                    .cloned();
                let result = match found {
                    Some(bytes) => verified(reference, &bytes),
                    None => Err("the server no longer has this content; it was not shown".into()),
                };
                self.events.push_back(SourceEvent::Content {
                    run_id: run_id.clone(),
                    reference: reference.clone(),
                    result,
                });
            }
            Command::FetchPage {
                run_id,
                collection,
                cursor,
                revision,
            } => {
                let page = self
                    .pages
                    .iter()
                    .find(|(run, page)| run == run_id && page.collection == *collection)
                    .map(|(_, page)| page.clone())
                    .unwrap_or_else(|| empty_page(*collection, cursor.clone(), *revision));
                self.events.push_back(SourceEvent::Page {
                    run_id: run_id.clone(),
                    page,
                });
            }
            Command::ListResources => {
                let result = self
                    .resources
                    .clone()
                    .ok_or_else(|| "the fake has no resources to list".to_owned());
                self.events.push_back(SourceEvent::ResourceList(result));
            }
            Command::GetResource { controller, key } => {
                let result = self
                    .resource_views
                    .iter()
                    .find(|view| view.controller.as_str() == controller && view.key.as_str() == key)
                    .map(|view| Box::new(view.clone()))
                    .ok_or_else(|| format!("no resource {controller}/{key}"));
                self.events.push_back(SourceEvent::Resource {
                    controller: controller.clone(),
                    key: key.clone(),
                    result,
                });
            }
            Command::WatchRuns
            | Command::WatchRun { .. }
            | Command::UnwatchRun { .. }
            | Command::Control(_) => {}
        }
    }
}

/// An empty page of `collection` at `revision`.
pub fn empty_page(collection: PageCollection, cursor: Option<String>, revision: u64) -> ViewPage {
    let mut value = serde_json::json!({
        "collection": collection, "revision": revision, "items": [],
    });
    if let Some(cursor) = cursor {
        value["cursor"] = Value::String(cursor);
    }
    serde_json::from_value(value).unwrap_or_else(|_| unreachable!("an empty page is valid"))
}

impl Source for FakeSource {
    fn send(&mut self, command: Command) {
        self.answer(&command);
        self.sent.push(command);
    }

    fn try_next(&mut self) -> Option<SourceEvent> {
        self.events.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::content::digest_text;

    fn reference(bytes: &[u8]) -> ContentReference {
        serde_json::from_value(serde_json::json!({
            "digest": digest_text(bytes), "mediaType": "text/plain", "bytes": bytes.len(),
        }))
        .unwrap()
    }

    #[test]
    fn content_is_verified_by_length_and_digest() {
        let good = reference(b"hello");
        assert_eq!(verified(&good, b"hello"), Ok(b"hello".to_vec()));
        assert!(verified(&good, b"hell").is_err());
        assert!(verified(&good, b"jello").is_err());
    }

    #[test]
    fn the_fake_refuses_content_that_does_not_match_its_reference() {
        let mut fake = FakeSource::new();
        fake.contents.push(b"hello".to_vec());
        let mut lying = reference(b"hello");
        lying.bytes = 4u64.try_into().unwrap();
        fake.send(Command::FetchContent {
            run_id: "r".into(),
            reference: lying,
        });
        match fake.try_next() {
            Some(SourceEvent::Content {
                result: Err(line), ..
            }) => {
                assert!(line.contains("not shown"), "{line}")
            }
            other => panic!("{other:?}"),
        }
    }
}
