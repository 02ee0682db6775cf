//! The client against servers written in the test (a real Unix socket and
//! canonical frames): bounded waits for a server that does not answer, and
//! content that must be assembled from 512 KiB parts and verified.

use pi_workflows_client::{
    CallOptions, ClientError, ClientOptions, ContentFailure, Home, Waited, WorkflowClient, ops,
};
use serde_json::{Value, json};
use std::path::Path;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

/// How the fake server behaves.
#[derive(Clone, Copy)]
enum Fake {
    /// Accepts and never says a word.
    Silent,
    /// Says hello and never answers a request.
    HelloOnly,
    /// Serves `view.content` of [`content`], one byte changed when `tamper`.
    Content { tamper: bool },
}

/// 1.3 MB of canonical JSON: three parts of at most 512 KiB.
fn content() -> Vec<u8> {
    protocol::canonicalize(&json!({ "pad": "z".repeat(1_300_000) })).unwrap()
}

fn reference() -> Value {
    let bytes = content();
    json!({ "digest": protocol::content::digest_text(&bytes), "mediaType": "application/json", "bytes": bytes.len() })
}

fn frame(value: &Value) -> Vec<u8> {
    let mut bytes = protocol::canonicalize(value).unwrap();
    bytes.push(b'\n');
    bytes
}

async fn serve(stream: UnixStream, fake: Fake) {
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read).lines();
    if matches!(fake, Fake::Silent) {
        // Hold the connection open without answering.
        while let Ok(Some(_)) = lines.next_line().await {}
        return;
    }
    let hello = json!({ "schema": "pi-workflows.client.v1", "type": "hello", "role": "server",
        "protocolVersion": 1, "packageVersion": pi_workflows_client::PACKAGE_VERSION, "serverEpoch": 7 });
    let _ = write.write_all(&frame(&hello)).await;
    let mut served = content();
    if let Fake::Content { tamper: true } = fake {
        served[700_000] = b'q';
    }
    while let Ok(Some(line)) = lines.next_line().await {
        let request: Value = serde_json::from_str(&line).unwrap();
        if request["type"] != "request" || matches!(fake, Fake::HelloOnly) {
            continue;
        }
        let offset = request["payload"]["offset"].as_u64().unwrap() as usize;
        let length = request["payload"]["length"].as_u64().unwrap() as usize;
        let end = (offset + length).min(served.len());
        use base64::Engine as _;
        let data = base64::engine::general_purpose::STANDARD.encode(&served[offset..end]);
        let response = json!({ "schema": "pi-workflows.client.v1", "type": "response",
            "requestId": request["requestId"], "operation": "view.content", "outcome": "accepted",
            "receipt": { "reference": reference(), "offset": offset, "data": data,
                "final": end == served.len(), "digest": reference()["digest"] } });
        let _ = write.write_all(&frame(&response)).await;
    }
}

/// A fake server on `home`'s socket.
fn fake_server(home: &Home, fake: Fake) {
    std::fs::create_dir_all(home.host_dir()).unwrap();
    let listener = UnixListener::bind(home.socket_path()).unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(serve(stream, fake));
        }
    });
}

fn client(dir: &Path, fake: Fake, limit: Duration) -> WorkflowClient {
    let home = Home::at(dir.join("state"));
    fake_server(&home, fake);
    let mut options = ClientOptions::new(home);
    options.answer_limit = Some(limit);
    WorkflowClient::new(options)
}

#[tokio::test]
async fn a_server_that_never_says_hello_is_a_bounded_wait() {
    let dir = tempfile::tempdir().unwrap();
    let limit = Duration::from_millis(300);
    let mut client = client(dir.path(), Fake::Silent, limit);
    assert_eq!(
        client.connect().await.unwrap_err(),
        ClientError::TimedOut {
            waited_for: Waited::Hello,
            limit
        }
    );
}

#[tokio::test]
async fn a_command_without_an_answer_is_a_bounded_wait_that_says_it_may_still_apply() {
    let dir = tempfile::tempdir().unwrap();
    let limit = Duration::from_millis(300);
    let mut client = client(dir.path(), Fake::HelloOnly, limit);
    let error = client
        .call_json::<ops::RunPause>(Some("r-1"), json!({}), CallOptions::default())
        .await
        .unwrap_err();
    assert_eq!(
        error,
        ClientError::TimedOut {
            waited_for: Waited::Response {
                operation: "run.pause".into(),
                state_changing: true
            },
            limit
        }
    );
    assert!(
        error.to_string().contains("it may still apply it"),
        "{error}"
    );
    let read = client
        .call_json::<ops::RunsList>(None, json!({}), CallOptions::default())
        .await
        .unwrap_err();
    assert!(matches!(
        read,
        ClientError::TimedOut {
            waited_for: Waited::Response {
                state_changing: false,
                ..
            },
            ..
        }
    ));
}

#[tokio::test]
async fn content_of_three_parts_is_assembled_and_verified() {
    let dir = tempfile::tempdir().unwrap();
    let mut client = client(
        dir.path(),
        Fake::Content { tamper: false },
        Duration::from_secs(10),
    );
    let reference = serde_json::from_value(reference()).unwrap();
    let bytes = client.read_content("r-1", &reference).await.unwrap();
    assert_eq!(bytes, content());
    assert!(bytes.len() > 2 * 512 * 1024, "three parts at least");
}

#[tokio::test]
async fn content_whose_bytes_do_not_match_the_digest_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut client = client(
        dir.path(),
        Fake::Content { tamper: true },
        Duration::from_secs(10),
    );
    let reference = serde_json::from_value(reference()).unwrap();
    assert_eq!(
        client.read_content("r-1", &reference).await,
        Err(ClientError::Content(ContentFailure::DigestMismatch))
    );
}
