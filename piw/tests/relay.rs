//! `piw serve` against the real server: the same subscription through the
//! socket and through the relay yields byte-identical frames; non-loopback
//! binds and foreign Origins are refused; an oversized or non-canonical
//! message closes only its own connection; the relay's connection ends
//! with the server's. Needs `cargo build -p server`.

mod support;

use std::time::Duration;

use futures_util::{SinkExt as _, StreamExt as _};
use serde_json::{Value, json};
use support::live::{RelayProcess, Server, piw, wait_for};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::{Message, Utf8Bytes};

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

fn frame(value: &Value) -> Vec<u8> {
    protocol::canonicalize(value).unwrap()
}

fn hello(client_id: &str) -> Value {
    json!({ "schema": "pi-workflows.client.v1", "type": "hello", "role": "client",
        "clientId": client_id, "protocolVersion": 1,
        "packageVersion": pi_workflows_client::PACKAGE_VERSION })
}

fn request(
    client_id: &str,
    id: &str,
    operation: &str,
    run_id: Option<&str>,
    payload: Value,
) -> Value {
    let mut request = json!({ "schema": "pi-workflows.client.v1", "type": "request",
        "requestId": id, "clientId": client_id, "operation": operation, "payload": payload });
    if let Some(run_id) = run_id {
        request["runId"] = json!(run_id);
    }
    request
}

/// One side of the comparison: raw frames (without their `\n`).
enum Side {
    Socket(
        tokio::io::Lines<BufReader<tokio::net::unix::OwnedReadHalf>>,
        tokio::net::unix::OwnedWriteHalf,
    ),
    Relay(Box<Ws>),
}

impl Side {
    async fn send(&mut self, value: &Value) {
        match self {
            Side::Socket(_, write) => {
                let mut bytes = frame(value);
                bytes.push(b'\n');
                write.write_all(&bytes).await.unwrap();
            }
            Side::Relay(ws) => {
                let text = String::from_utf8(frame(value)).unwrap();
                ws.send(Message::Text(Utf8Bytes::from(text))).await.unwrap();
            }
        }
    }

    /// The next frame's bytes, or `None` after `idle` without one.
    async fn next(&mut self, idle: Duration) -> Option<Vec<u8>> {
        let next = async {
            match self {
                Side::Socket(lines, _) => lines.next_line().await.unwrap().map(String::into_bytes),
                Side::Relay(ws) => loop {
                    match ws.next().await?.unwrap() {
                        Message::Text(text) => return Some(text.as_bytes().to_vec()),
                        Message::Binary(bytes) => return Some(bytes.to_vec()),
                        Message::Close(_) => return None,
                        Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => {}
                    }
                },
            }
        };
        tokio::time::timeout(idle, next).await.ok().flatten()
    }
}

async fn socket_side(server: &Server) -> Side {
    let stream = tokio::net::UnixStream::connect(server.socket())
        .await
        .unwrap();
    let (read, write) = stream.into_split();
    Side::Socket(BufReader::new(read).lines(), write)
}

async fn ws(relay: &RelayProcess) -> Ws {
    tokio_tungstenite::connect_async(relay.url())
        .await
        .unwrap()
        .0
}

/// Follows one run through `side` (hello, subscribe, every frame until
/// the run is quiet after `expect` frames), replacing the connection's
/// subscription id with `SUB` (the server picks it per connection; every
/// other byte is compared as sent).
async fn follow(mut side: Side, client_id: &str, run_id: &str, expect: usize) -> Vec<Vec<u8>> {
    side.send(&hello(client_id)).await;
    let mut frames = vec![side.next(Duration::from_secs(10)).await.expect("the hello")];
    side.send(&request(
        client_id,
        "r1",
        "subscribe",
        None,
        json!({ "target": { "kind": "run", "runId": run_id } }),
    ))
    .await;
    let mut subscription = None;
    while let Some(bytes) = side
        .next(Duration::from_secs(if frames.len() < expect {
            20
        } else {
            2
        }))
        .await
    {
        let value: Value = serde_json::from_slice(&bytes).unwrap();
        if let Some(id) = value
            .pointer("/receipt/subscriptionId")
            .and_then(Value::as_str)
        {
            subscription = Some(id.to_owned());
        }
        frames.push(bytes);
    }
    let id = subscription.expect("a subscription id");
    frames
        .into_iter()
        .map(|bytes| {
            String::from_utf8(bytes)
                .unwrap()
                .replace(&id, "SUB")
                .into_bytes()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_subscription_through_the_socket_and_the_relay_is_byte_identical() {
    let server = Server::started();
    let run = server.start("paused");
    wait_for("the stall", Duration::from_secs(30), || {
        (server.view(&run)["display"]["currentNode"] == "long").then_some(())
    });
    let relay = RelayProcess::start(&server, "127.0.0.1:0");
    // Same client id length on both sides ("parity-a" / "parity-b" never
    // appear in server frames; request ids are the same).
    let direct = tokio::spawn({
        let side = socket_side(&server).await;
        let run = run.clone();
        async move { follow(side, "parity-a", &run, 4).await }
    });
    let relayed = tokio::spawn({
        let side = Side::Relay(Box::new(ws(&relay).await));
        let run = run.clone();
        async move { follow(side, "parity-b", &run, 4).await }
    });
    // Both are subscribed (each got its snapshot); then the run moves.
    tokio::time::sleep(Duration::from_millis(800)).await;
    server.cli(&["pause", &run]);
    server.wait_status(&run, "paused");
    server.cli(&["resume", &run]);
    let direct = direct.await.unwrap();
    let relayed = relayed.await.unwrap();
    assert!(
        direct.len() >= 4,
        "hello, response, snapshot, patches: {}",
        direct.len()
    );
    let kinds: Vec<String> = direct
        .iter()
        .map(|bytes| {
            let value: Value = serde_json::from_slice(bytes).unwrap();
            format!(
                "{}:{}",
                value["type"].as_str().unwrap(),
                value
                    .pointer("/event/kind")
                    .and_then(Value::as_str)
                    .unwrap_or("-")
            )
        })
        .collect();
    // Each side reads until 2 s pass without a frame, so under load one
    // side may stop a patch earlier than the other (the resumed run keeps
    // moving): the frames both read must be the same, in the same order —
    // a frame the relay dropped, added or changed shifts or breaks that
    // common run of frames — and it reaches the pause's patches.
    let common = direct.len().min(relayed.len());
    assert!(
        kinds[..common]
            .iter()
            .filter(|kind| *kind == "event:runViewPatch")
            .count()
            >= 2,
        "{kinds:?} (relayed {})",
        relayed.len()
    );
    for (index, (a, b)) in direct.iter().zip(&relayed).enumerate() {
        assert!(
            a == b,
            "frame {index} ({}) differs:\n{}\n{}",
            kinds[index],
            String::from_utf8_lossy(a),
            String::from_utf8_lossy(b)
        );
    }
}

#[test]
fn non_loopback_binds_are_refused() {
    let server = Server::started();
    for bind in ["0.0.0.0:0", "[::]:0", "192.0.2.1:9377"] {
        let output = std::process::Command::new(piw())
            .envs(server.env())
            .args(["serve", "--bind", bind])
            .output()
            .unwrap();
        let stderr = String::from_utf8(output.stderr).unwrap();
        assert!(!output.status.success(), "{bind} was accepted");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.contains("loopback addresses only"), "{stderr}");
    }
}

/// A WebSocket through the relay that said hello; the server's hello read.
async fn greeted(relay: &RelayProcess, client_id: &str) -> Ws {
    let mut ws = ws(relay).await;
    let text = String::from_utf8(frame(&hello(client_id))).unwrap();
    ws.send(Message::Text(Utf8Bytes::from(text))).await.unwrap();
    let Some(Ok(Message::Text(reply))) = ws.next().await else {
        panic!("no hello")
    };
    assert!(reply.as_str().contains("\"type\":\"hello\""), "{reply}");
    ws
}

/// The connection still works: `server.status` is answered.
async fn answers(ws: &mut Ws, client_id: &str, id: &str) {
    let text = String::from_utf8(frame(&request(
        client_id,
        id,
        "server.status",
        None,
        json!({}),
    )))
    .unwrap();
    ws.send(Message::Text(Utf8Bytes::from(text))).await.unwrap();
    let reply = tokio::time::timeout(Duration::from_secs(10), ws.next())
        .await
        .unwrap();
    let Some(Ok(Message::Text(reply))) = reply else {
        panic!("no answer: {reply:?}")
    };
    let value: Value = serde_json::from_str(reply.as_str()).unwrap();
    assert_eq!(value["requestId"], id, "{value}");
    assert_eq!(value["outcome"], "accepted", "{value}");
}

/// The close frame `ws` gets after sending `bytes`.
async fn closed_by(ws: &mut Ws, bytes: Vec<u8>) -> (CloseCode, String) {
    ws.send(Message::Binary(bytes.into())).await.unwrap();
    loop {
        match tokio::time::timeout(Duration::from_secs(10), ws.next())
            .await
            .unwrap()
        {
            Some(Ok(Message::Close(Some(frame)))) => return (frame.code, frame.reason.to_string()),
            Some(Ok(Message::Text(_))) => {}
            other => panic!("not a close frame: {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_origins_and_bad_frames_close_only_their_own_connection() {
    let server = Server::started();
    let relay = RelayProcess::start(&server, "127.0.0.1:0");
    let mut bystander = greeted(&relay, "bystander").await;

    // A handshake with an Origin is refused before any WebSocket exists.
    let mut with_origin = relay.url().into_client_request().unwrap();
    with_origin
        .headers_mut()
        .insert("origin", "http://evil.example".parse().unwrap());
    match tokio_tungstenite::connect_async(with_origin).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            assert_eq!(response.status().as_u16(), 403);
        }
        other => panic!("a foreign Origin was accepted: {:?}", other.map(|_| ())),
    }
    // Another path is not served.
    let elsewhere = relay.url().replace("/ws", "/other");
    assert!(tokio_tungstenite::connect_async(elsewhere).await.is_err());

    // An oversized message: its connection is closed with a size close.
    let mut big = greeted(&relay, "big").await;
    let oversized = frame(&json!({ "pad": "x".repeat(protocol::MAX_FRAME_BYTES) }));
    let (code, reason) = closed_by(&mut big, oversized).await;
    assert_eq!(code, CloseCode::Size, "{reason}");
    assert!(reason.starts_with("frameTooLarge"), "{reason}");
    answers(&mut bystander, "bystander", "b1").await;

    // A non-canonical object (spaces), and a message that is not an object.
    for bytes in [
        br#"{ "type": "request" }"#.to_vec(),
        b"[1,2]".to_vec(),
        b"{\"a\":1}\n{\"b\":2}".to_vec(),
    ] {
        let mut bad = greeted(&relay, "bad").await;
        let (code, reason) = closed_by(&mut bad, bytes).await;
        assert_eq!(code, CloseCode::Invalid, "{reason}");
        answers(&mut bystander, "bystander", &format!("b-{}", reason.len())).await;
    }
    answers(&mut bystander, "bystander", "b-last").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relayed_connection_ends_with_the_server_connection() {
    let server = Server::started();
    let relay = RelayProcess::start(&server, "127.0.0.1:0");
    let mut ws = greeted(&relay, "coupled").await;
    answers(&mut ws, "coupled", "c1").await;
    // The server stops: it closes its socket connections, and the relay
    // closes the WebSocket of each one.
    server.cli(&["server", "stop"]);
    let ended = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match ws.next().await {
                None | Some(Err(_)) | Some(Ok(Message::Close(_))) => return,
                Some(Ok(_)) => {}
            }
        }
    })
    .await;
    assert!(
        ended.is_ok(),
        "the WebSocket outlived its server connection"
    );
    // Without a server, a new handshake is refused with the start line.
    match tokio_tungstenite::connect_async(relay.url()).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            assert_eq!(response.status().as_u16(), 503);
            let body = String::from_utf8(response.body().clone().unwrap_or_default()).unwrap();
            assert!(body.contains("pi-workflows server start"), "{body}");
        }
        other => panic!("a handshake without a server: {:?}", other.map(|_| ())),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_a_websocket_closes_its_own_server_connection_only() {
    let server = Server::started();
    let relay = RelayProcess::start(&server, "127.0.0.1:0");
    let idle = relay.sockets();
    let mut kept = greeted(&relay, "kept").await;
    let mut closed = greeted(&relay, "closed").await;
    // Each WebSocket holds its TCP connection and its own server connection.
    wait_for("two relayed connections", Duration::from_secs(10), || {
        (relay.sockets() == idle + 4).then_some(())
    });
    closed.close(None).await.unwrap();
    // The relay answers the close (bounded: a relay that kept the
    // connection would not).
    let _ = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(Ok(_)) = closed.next().await {}
    })
    .await;
    wait_for(
        "the closed one's server connection gone",
        Duration::from_secs(10),
        || (relay.sockets() == idle + 2).then_some(()),
    );
    answers(&mut kept, "kept", "k1").await;
    drop(kept);
    wait_for(
        "every relayed connection gone",
        Duration::from_secs(10),
        || (relay.sockets() == idle).then_some(()),
    );
}
