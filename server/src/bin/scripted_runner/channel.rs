//! The runner end of the runner.v1 channel: the launch envelope, message
//! ids, framed writes on stdout, and a reader thread for the server's frames
//! on stdin.
//!
//! Every runner message is assembled as JSON (the common fields added here)
//! and deserialized into the generated `RunnerMessage`, so each constraint
//! the schema states is checked before `encode_runner` writes the frame.

use std::io::{self, Read, Write};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread;
use std::time::{Duration, Instant};

use protocol::content::{self, Assembler, ContentFailure, Part};
use protocol::generated::types::{
    CommandState, ExitReason, ReplyNext, ReplyOutcome, SafeError, StartDeadline, WorkerSchemaId,
};
use protocol::{
    FrameDecoder, RunnerMessage, ServerMessage, WorkerLaunch, decode_launch, decode_server_frame,
    encode_runner, frame_content, runner_kind,
};
use serde_json::{Map, Value, json};

use crate::{EXIT_CHANNEL_CLOSED, EXIT_CRASH, EXIT_PROTOCOL, log};

/// How often and how many times a fenced runner keeps writing.
const FENCED_WRITES: u32 = 20;
const FENCED_INTERVAL: Duration = Duration::from_millis(100);
/// How long a fenced write waits for its reply before the next one.
const FENCED_REPLY_WAIT: Duration = Duration::from_millis(500);
/// The largest referenced value this runner reads.
const MAX_CONTENT_BYTES: u64 = 256 << 20;

/// A frame from the server, or the end of the stream.
enum Incoming {
    Frame(ServerMessage),
    Closed(String),
}

/// A `reply` from the server.
#[derive(Debug)]
pub(crate) struct Reply {
    pub(crate) outcome: ReplyOutcome,
    /// The result (read from `resultContent` when the server referenced it).
    pub(crate) result: Value,
    /// The reference of a result that did not fit a frame.
    result_content: Option<Value>,
    pub(crate) next: Option<ReplyNext>,
    pub(crate) error: Option<SafeError>,
}

/// What the server asks for after `runner.ready` or a finished attempt.
#[derive(Debug)]
pub(crate) enum Next {
    /// Run this node attempt.
    Run {
        node_id: String,
        attempt_id: String,
        visit: u64,
        /// The deadline the server committed with the dispatch (`None`: the
        /// runner resolves it, as for the `command`'s node).
        deadline: Option<StartDeadline>,
    },
    /// Send `runner.exiting` with this reason and exit 0.
    Exit(ExitReason),
}

/// A message that was written: its id and how many copies went out.
#[derive(Debug)]
pub(crate) struct Sent {
    pub(crate) id: String,
    copies: u32,
}

/// The open channel.
#[derive(Debug)]
pub(crate) struct Channel {
    run_id: Value,
    generation: Value,
    runner_epoch: String,
    counter: u64,
    frames: Receiver<Incoming>,
    /// The next message is written twice with one id (`duplicate`).
    pub(crate) duplicate_next: bool,
    /// `startup.keepWritingAfterClaimLost`.
    pub(crate) keep_writing_after_claim_lost: bool,
    /// The attempt being run, for the fenced writes after a lost claim.
    pub(crate) attempt_id: Option<String>,
    /// The run state of the command this runner received.
    pub(crate) state: Option<Value>,
}

/// One chunk of referenced content (`content.chunk`).
#[derive(Debug)]
pub(crate) struct Chunk {
    pub(crate) reference: Value,
    pub(crate) offset: u64,
    pub(crate) data: String,
    pub(crate) last: bool,
}

/// The answer to a `content.read`: a chunk, or a reply that refuses it.
#[derive(Debug)]
pub(crate) enum ReadAnswer {
    Chunk(Chunk),
    Refused(Reply),
}

impl std::fmt::Debug for Incoming {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Frame(message) => write!(f, "Frame({})", protocol::server_kind(message)),
            Self::Closed(why) => write!(f, "Closed({why})"),
        }
    }
}

/// stdin, with what was read of it and not decoded yet.
#[derive(Debug)]
pub(crate) struct Stdin {
    stdin: io::Stdin,
    decoder: FrameDecoder,
    buf: Vec<u8>,
}

impl Stdin {
    pub(crate) fn new() -> Self {
        Self {
            stdin: io::stdin(),
            decoder: FrameDecoder::new(),
            buf: vec![0u8; 64 * 1024],
        }
    }

    /// Reads the next launch envelope: the first stdin line, or (a resolver
    /// that awaits its run) the next one. `Ok(None)`: stdin ended first.
    pub(crate) fn launch(&mut self) -> Result<Option<WorkerLaunch>, String> {
        let frame = loop {
            match self.decoder.next_frame() {
                Ok(Some(frame)) => break frame,
                Ok(None) => {}
                Err(e) => return Err(format!("launch envelope: {e}")),
            }
            match self.stdin.read(&mut self.buf) {
                Ok(0) => return Ok(None),
                Ok(n) => self.decoder.push(&self.buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("reading stdin: {e}")),
            }
        };
        let content = frame_content(&frame).map_err(|e| format!("launch envelope: {e}"))?;
        decode_launch(content)
            .map(Some)
            .map_err(|e| format!("launch envelope: {e}"))
    }
}

impl Channel {
    /// The channel of `launch`: its frames carry the launch's run id,
    /// generation and epoch; a reader thread decodes the server's frames
    /// from `stdin` (without one, the channel only writes: a resolver's).
    pub(crate) fn open(launch: &WorkerLaunch, stdin: Option<Stdin>) -> Self {
        let (tx, frames) = mpsc::channel();
        if let Some(stdin) = stdin {
            thread::spawn(move || read_frames(stdin, &tx));
        }
        Self {
            run_id: json!(launch.run_id),
            generation: json!(launch.generation),
            runner_epoch: launch.runner_epoch.to_string(),
            counter: 0,
            frames,
            duplicate_next: false,
            keep_writing_after_claim_lost: false,
            attempt_id: None,
            state: None,
        }
    }
}

/// The reader thread: decodes server frames until end of stream or the
/// first error (both end the channel).
fn read_frames(input: Stdin, tx: &mpsc::Sender<Incoming>) {
    let Stdin {
        mut stdin,
        mut decoder,
        mut buf,
    } = input;
    loop {
        loop {
            match decoder.next_frame() {
                Ok(Some(frame)) => match decode_server_frame(&frame) {
                    Ok(message) => {
                        if tx.send(Incoming::Frame(message)).is_err() {
                            return;
                        }
                    }
                    Err(e) => {
                        let _ = tx.send(Incoming::Closed(format!("server frame: {e}")));
                        return;
                    }
                },
                Ok(None) => break,
                Err(e) => {
                    let _ = tx.send(Incoming::Closed(format!("server framing: {e}")));
                    return;
                }
            }
        }
        match stdin.read(&mut buf) {
            Ok(0) => {
                let why = match decoder.finish() {
                    Ok(()) => "end of stdin".to_string(),
                    Err(e) => format!("end of stdin: {e}"),
                };
                let _ = tx.send(Incoming::Closed(why));
                return;
            }
            Ok(n) => decoder.push(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                let _ = tx.send(Incoming::Closed(format!("reading stdin: {e}")));
                return;
            }
        }
    }
}

/// A server frame as the runner sees it.
enum Frame {
    Reply { to: String, reply: Reply },
    Command(Next, CommandState),
    Chunk { to: String, chunk: Chunk },
}

fn classify(message: ServerMessage) -> Frame {
    match message {
        ServerMessage::Reply {
            in_reply_to,
            outcome,
            result,
            result_content,
            next,
            error,
            ..
        } => Frame::Reply {
            to: in_reply_to.to_string(),
            reply: Reply {
                outcome,
                result,
                result_content: result_content.map(|reference| json!(reference)),
                next,
                error,
            },
        },
        ServerMessage::Command {
            command,
            node,
            state,
            ..
        } => {
            log!(
                "<- command {command} node {} visit {}",
                node.node_id.as_str(),
                node.visit
            );
            Frame::Command(
                Next::Run {
                    node_id: node.node_id.to_string(),
                    attempt_id: node.attempt_id.to_string(),
                    visit: node.visit.get(),
                    deadline: None,
                },
                state,
            )
        }
        ServerMessage::ContentChunk {
            in_reply_to,
            reference,
            offset,
            data,
            final_,
            ..
        } => Frame::Chunk {
            to: in_reply_to.to_string(),
            chunk: Chunk {
                reference: json!(reference),
                offset: offset.get(),
                data: data.to_string(),
                last: final_,
            },
        },
    }
}

fn next_of(next: ReplyNext) -> Next {
    match next {
        ReplyNext::RunNode {
            attempt_id,
            deadline,
            node_id,
            visit,
        } => Next::Run {
            node_id: node_id.to_string(),
            attempt_id: attempt_id.to_string(),
            visit: visit.get(),
            deadline,
        },
        ReplyNext::Exit { reason } => Next::Exit(reason),
    }
}

fn describe(reply: &Reply) -> String {
    let mut text = reply.outcome.to_string();
    match &reply.next {
        Some(ReplyNext::RunNode { node_id, visit, .. }) => {
            text.push_str(&format!(
                ", next runNode {} visit {visit}",
                node_id.as_str()
            ));
        }
        Some(ReplyNext::Exit { reason }) => text.push_str(&format!(", next exit {reason}")),
        None => {}
    }
    if let Some(error) = &reply.error {
        text.push_str(&format!(", error {}", error.code));
    }
    text
}

impl Channel {
    /// The run this runner runs.
    pub(crate) fn run_id(&self) -> Option<&str> {
        self.run_id.as_str()
    }

    /// Assembles a runner message of `kind` from `fields` plus the common
    /// fields and a fresh message id.
    fn build(&mut self, kind: &str, fields: Value) -> (String, RunnerMessage) {
        let id = self.fresh_id();
        (id.clone(), self.build_with_id(kind, fields, id))
    }

    /// The next message id: `<runnerEpoch>-m<counter>`.
    pub(crate) fn fresh_id(&mut self) -> String {
        self.counter += 1;
        format!("{}-m{}", self.runner_epoch, self.counter)
    }

    fn build_with_id(&self, kind: &str, fields: Value, id: String) -> RunnerMessage {
        let mut object = match fields {
            Value::Object(object) => object,
            _ => Map::new(),
        };
        object.insert("type".into(), json!(kind));
        object.insert(
            "schema".into(),
            json!(WorkerSchemaId::PiWorkflowsWorkerLaunchV1),
        );
        object.insert("runId".into(), self.run_id.clone());
        object.insert("generation".into(), self.generation.clone());
        object.insert("runnerEpoch".into(), json!(self.runner_epoch));
        object.insert("messageId".into(), json!(id));
        match serde_json::from_value(Value::Object(object)) {
            Ok(message) => message,
            Err(e) => {
                log!("cannot build {kind}: {e}");
                std::process::exit(EXIT_PROTOCOL);
            }
        }
    }

    fn write(message: &RunnerMessage) -> io::Result<()> {
        let bytes = encode_runner(message).map_err(|e| io::Error::other(e.to_string()))?;
        let mut out = io::stdout().lock();
        out.write_all(&bytes)?;
        out.flush()
    }

    /// An `effect.settle` result `{"pad": "x…"}` sized so that the settle
    /// message of `effect_id`, as `send` would write it next, is exactly
    /// `frame_bytes` bytes (its `\n` included).
    pub(crate) fn padded_settle_result(&self, effect_id: &str, frame_bytes: usize) -> Value {
        let id = format!("{}-m{}", self.runner_epoch, self.counter + 1);
        let frame = |pad: &str| {
            let fields = json!({"effectId": effect_id, "state": "applied", "result": {"pad": pad}});
            encode_runner(&self.build_with_id("effect.settle", fields, id.clone()))
                .map_or(0, |bytes| bytes.len())
        };
        let empty = frame("");
        let pad = "x".repeat(frame_bytes.saturating_sub(empty));
        json!({"pad": pad})
    }

    /// Writes a message (twice when a `duplicate` is pending) without
    /// waiting for a reply.
    pub(crate) fn send(&mut self, kind: &str, fields: Value) -> Sent {
        let (id, message) = self.build(kind, fields);
        let copies = if std::mem::take(&mut self.duplicate_next) {
            2
        } else {
            1
        };
        for copy in 1..=copies {
            log!(
                "-> {} {id}{}",
                runner_kind(&message),
                if copies > 1 {
                    format!(" (copy {copy} of {copies})")
                } else {
                    String::new()
                }
            );
            if let Err(e) = Self::write(&message) {
                log!("writing stdout: {e}");
                std::process::exit(EXIT_CHANNEL_CLOSED);
            }
        }
        Sent { id, copies }
    }

    /// Writes `kind` under the message id `id` (a protocol violation when the
    /// id was used for another payload) and waits for its reply.
    pub(crate) fn request_with_id(&mut self, kind: &str, fields: Value, id: String) -> Reply {
        let message = self.build_with_id(kind, fields, id.clone());
        log!("-> {} {id} (chosen id)", runner_kind(&message));
        if let Err(e) = Self::write(&message) {
            log!("writing stdout: {e}");
            std::process::exit(EXIT_CHANNEL_CLOSED);
        }
        self.await_reply(&id)
    }

    /// Writes `bytes` and a newline as one frame, unchecked (a protocol
    /// violation).
    pub(crate) fn send_raw(&mut self, bytes: &[u8]) {
        log!("-> a raw frame of {} bytes", bytes.len());
        let mut out = io::stdout().lock();
        let written = out
            .write_all(bytes)
            .and_then(|()| out.write_all(b"\n"))
            .and_then(|()| out.flush());
        if let Err(e) = written {
            log!("writing stdout: {e}");
            std::process::exit(EXIT_CHANNEL_CLOSED);
        }
    }

    /// Writes a message and waits for its reply (one per copy; the first is
    /// returned). A `claimLost` reply ends the runner.
    pub(crate) fn request(&mut self, kind: &str, fields: Value) -> Reply {
        let sent = self.send(kind, fields);
        let first = self.await_reply(&sent.id);
        for _ in 1..sent.copies {
            self.await_reply(&sent.id);
        }
        first
    }

    fn receive(&mut self) -> ServerMessage {
        match self.frames.recv() {
            Ok(Incoming::Frame(message)) => message,
            Ok(Incoming::Closed(why)) => {
                log!("channel closed ({why}); exiting");
                std::process::exit(EXIT_CHANNEL_CLOSED);
            }
            Err(_) => {
                log!("reader thread gone; exiting");
                std::process::exit(EXIT_CHANNEL_CLOSED);
            }
        }
    }

    /// Waits for the reply to message `id`, skipping (and logging) replies
    /// to other messages and anything else.
    fn await_reply(&mut self, id: &str) -> Reply {
        loop {
            match classify(self.receive()) {
                Frame::Reply { to, reply } => {
                    log!("<- reply to {to}: {}", describe(&reply));
                    if reply.outcome == ReplyOutcome::ClaimLost {
                        self.claim_lost();
                    }
                    if to == id {
                        return self.materialized(reply);
                    }
                }
                Frame::Command(..) => log!("unexpected command ignored"),
                Frame::Chunk { to, .. } => log!("<- content.chunk for {to} ignored"),
            }
        }
    }

    /// A reply whose result was referenced, with the result read.
    fn materialized(&mut self, mut reply: Reply) -> Reply {
        if let Some(reference) = reply.result_content.take() {
            reply.result = self
                .read_json(&reference)
                .unwrap_or_else(|failure| self.content_failed(failure));
            log!("read the referenced reply result");
        }
        reply
    }

    /// Reads referenced JSON content in verified parts of at most 512 KiB.
    pub(crate) fn read_json(&mut self, reference: &Value) -> Result<Value, ContentFailure> {
        let mut assembler = Assembler::new(reference, Some(content::JSON), MAX_CONTENT_BYTES)?;
        while let Some(request) = assembler.next_request() {
            let fields =
                json!({"reference": reference, "offset": request.offset, "length": request.length});
            match self.read(fields) {
                ReadAnswer::Chunk(chunk) => assembler.accept(Part {
                    reference: &chunk.reference,
                    offset: chunk.offset,
                    data: &chunk.data,
                    last: chunk.last,
                    digest: None,
                })?,
                ReadAnswer::Refused(_) => return Err(ContentFailure::Unavailable),
            }
        }
        content::json(&assembler.finish()?)
    }

    /// Referenced content could not be read: one log line, then exit 2.
    fn content_failed(&mut self, failure: ContentFailure) -> ! {
        log!("referenced content: {failure}; exiting");
        self.send("runner.exiting", json!({"reason": "fatal"}));
        std::process::exit(EXIT_PROTOCOL);
    }

    /// Sends `content.read` and waits for its chunk (or the reply that
    /// refuses it).
    pub(crate) fn read(&mut self, fields: Value) -> ReadAnswer {
        let sent = self.send("content.read", fields);
        loop {
            match classify(self.receive()) {
                Frame::Chunk { to, chunk } if to == sent.id => {
                    log!(
                        "<- content.chunk at {} (final {})",
                        chunk.offset,
                        chunk.last
                    );
                    return ReadAnswer::Chunk(chunk);
                }
                Frame::Reply { to, reply } if to == sent.id => {
                    log!("<- reply to {to}: {}", describe(&reply));
                    if reply.outcome == ReplyOutcome::ClaimLost {
                        self.claim_lost();
                    }
                    return ReadAnswer::Refused(reply);
                }
                Frame::Reply { to, reply } => {
                    log!("<- reply to {to}: {}", describe(&reply));
                    if reply.outcome == ReplyOutcome::ClaimLost {
                        self.claim_lost();
                    }
                }
                Frame::Command(..) => log!("unexpected command ignored"),
                Frame::Chunk { to, .. } => log!("<- content.chunk for {to} ignored"),
            }
        }
    }

    /// Waits for the server's answer to `runner.ready` (message `ready`): a
    /// `command`, or a `reply` whose `next` says what to do.
    pub(crate) fn await_dispatch(&mut self, ready: &str) -> Next {
        loop {
            match classify(self.receive()) {
                Frame::Command(next, state) => {
                    let state = match state {
                        CommandState::Inline { value } => json!(value),
                        CommandState::Reference { reference } => {
                            let state = self
                                .read_json(&json!(reference))
                                .unwrap_or_else(|failure| self.content_failed(failure));
                            log!("read the referenced run state");
                            state
                        }
                    };
                    self.state = Some(state);
                    return next;
                }
                Frame::Chunk { to, .. } => log!("<- content.chunk for {to} ignored"),
                Frame::Reply { to, reply } => {
                    log!("<- reply to {to}: {}", describe(&reply));
                    if reply.outcome == ReplyOutcome::ClaimLost {
                        self.claim_lost();
                    }
                    if let Some(next) = reply.next {
                        return next_of(next);
                    }
                    if to == ready && reply.outcome == ReplyOutcome::Rejected {
                        log!("runner.ready was rejected; exiting");
                        std::process::exit(EXIT_PROTOCOL);
                    }
                }
            }
        }
    }

    /// The instruction a reply to `node.finished`/`node.failed` carries.
    pub(crate) fn next_after(reply: Reply) -> Next {
        match reply.next {
            Some(next) => next_of(next),
            None => {
                log!(
                    "the reply carries no next instruction ({}); exiting",
                    describe(&reply)
                );
                std::process::exit(EXIT_PROTOCOL);
            }
        }
    }

    /// A `claimLost` reply: exit 3, or first keep writing `node.update`
    /// messages (fresh ids, every 100 ms, 20 times) and log each reply, so a
    /// test can prove a fenced runner's writes never commit.
    pub(crate) fn claim_lost(&mut self) -> ! {
        if !self.keep_writing_after_claim_lost {
            log!("claim lost; exiting");
            std::process::exit(EXIT_CRASH);
        }
        log!("claim lost; writing anyway");
        let attempt = self
            .attempt_id
            .clone()
            .unwrap_or_else(|| "fenced".to_string());
        for write in 1..=FENCED_WRITES {
            thread::sleep(FENCED_INTERVAL);
            let id = self.fresh_id();
            let message = self.build_with_id(
                "node.update",
                json!({
                    "attemptId": attempt,
                    "idempotencyKey": id,
                    "update": {"type": "fenced", "key": format!("write-{write}"), "data": {"write": write}},
                }),
                id.clone(),
            );
            log!("-> node.update {id} (fenced write {write})");
            if let Err(e) = Self::write(&message) {
                log!("writing stdout: {e}; exiting");
                std::process::exit(EXIT_CRASH);
            }
            self.await_fenced_reply(&id);
        }
        log!("done writing after the lost claim; exiting");
        std::process::exit(EXIT_CRASH);
    }

    fn await_fenced_reply(&mut self, id: &str) {
        let deadline = Instant::now() + FENCED_REPLY_WAIT;
        loop {
            let wait = deadline.saturating_duration_since(Instant::now());
            match self.frames.recv_timeout(wait) {
                Ok(Incoming::Frame(message)) => match classify(message) {
                    Frame::Reply { to, reply } => {
                        log!("<- reply to {to}: {}", describe(&reply));
                        if to == id {
                            return;
                        }
                    }
                    Frame::Command(..) => log!("unexpected command ignored"),
                    Frame::Chunk { to, .. } => log!("<- content.chunk for {to} ignored"),
                },
                Ok(Incoming::Closed(why)) => {
                    log!("channel closed ({why}); exiting");
                    std::process::exit(EXIT_CRASH);
                }
                Err(RecvTimeoutError::Timeout) => {
                    log!("no reply to {id}");
                    return;
                }
                Err(RecvTimeoutError::Disconnected) => {
                    log!("reader thread gone; exiting");
                    std::process::exit(EXIT_CRASH);
                }
            }
        }
    }
}
