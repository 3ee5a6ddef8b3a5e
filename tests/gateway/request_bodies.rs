//! `fencegate::proxy::body_decoder` against hyper's own HTTP/1 server: every chunked request body
//! in the corpus is sent to hyper's server (the auto builder the gateway serves with), whose
//! service reads it to its end; the decoder, given the same bytes and then the close, must yield
//! the same data and trailers where hyper's read succeeds, and fail where it fails (it refuses
//! more than hyper in one case, named below, and never less). The upstream
//! client decodes responses with it, and the HTTP/1 server that is to replace hyper's (issue 37)
//! is to decode requests with it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::BytesMut;
use fencegate::proxy::body_decoder::{BodyDecoder, BodyFraming, Decoded};
use http::HeaderMap;
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use hyper::{Request, Response};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::support::hyper_peer::serve_one;

/// A body read to its end: its data and trailers, or the failure (not compared).
type Read = Result<(Vec<u8>, Option<HeaderMap>), String>;

/// hyper's reading of `body`, sent chunked after a request head (the client's side closed when
/// hyper waits for more).
async fn hyper_reads(body: Vec<u8>) -> Read {
    let seen: Arc<Mutex<Option<Read>>> = Arc::new(Mutex::new(None));
    let record = Arc::clone(&seen);
    let addr = serve_one(move |request: Request<Incoming>| {
        let record = Arc::clone(&record);
        async move {
            let read = match request.into_body().collect().await {
                Ok(collected) => {
                    let trailers = collected.trailers().cloned();
                    Ok((collected.to_bytes().to_vec(), trailers))
                }
                Err(e) => Err(e.to_string()),
            };
            *record.lock().expect("record") = Some(read);
            Response::new(String::new())
        }
    })
    .await;
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let mut request = b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    request.extend_from_slice(&body);
    stream.write_all(&request).await.expect("write");
    // A whole body is answered at once; a body cut short waits for more, so the client closes
    // its side (not at once: hyper drops a request in flight when its client half-closes).
    let mut first = [0u8; 1];
    let answered = tokio::time::timeout(Duration::from_millis(500), stream.read(&mut first)).await;
    if answered.is_err() {
        stream.shutdown().await.expect("shut the write side");
        let mut sink = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut sink)).await;
    }
    let read = seen.lock().expect("record").take();
    read.unwrap_or_else(|| Err("the service never ran".to_owned()))
}

/// The decoder's reading of `body`, followed by the close.
fn decoder_reads(body: &[u8]) -> Read {
    let mut buffer = BytesMut::from(body);
    let mut decoder = BodyDecoder::new(BodyFraming::Chunked);
    let mut data = Vec::new();
    let mut trailers = None;
    loop {
        match decoder.decode(&mut buffer).map_err(|e| e.to_string())? {
            Decoded::Frame(frame) => match frame.into_data() {
                Ok(bytes) => data.extend_from_slice(&bytes),
                Err(frame) => trailers = frame.into_trailers().ok(),
            },
            Decoded::End => return Ok((data, trailers)),
            Decoded::NeedMore => {
                decoder.closed().map_err(|e| e.to_string())?;
                return Ok((data, trailers));
            }
        }
    }
}

/// The one body the decoder refuses and hyper reads: a trailer section ended by bare line feeds,
/// with more bytes after it. hyper ends the section at the first empty line and reads the rest as
/// the next request; the decoder looks for the end the other readers on the path would look for
/// (CRLF CRLF) and refuses the section, which is where they could disagree.
const STRICTER: &[u8] = b"5\r\nhello\r\n0\r\nX: 1\n\nJUNK\r\n\r\n";

fn corpus() -> Vec<Vec<u8>> {
    let mut bodies: Vec<Vec<u8>> = [
        &b"5\r\nhello\r\n0\r\n\r\n"[..],
        b"5;ext=1\r\nhello\r\n0\r\n\r\n",
        b"5 ;a=b\r\nhello\r\n0\r\n\r\n",
        b"5\t\r\nhello\r\n0\r\n\r\n",
        b"5;a=\"b c\"\r\nhello\r\n0\r\n\r\n",
        b"A\r\n0123456789\r\n0\r\n\r\n",
        b"a\r\n0123456789\r\n0\r\n\r\n",
        b"0005\r\nhello\r\n0\r\n\r\n",
        b"3\r\nabc\r\n3\r\ndef\r\n0\r\n\r\n",
        b"0\r\n\r\n",
        b"5\r\nhello\r\n0\r\nChecksum: 9\r\n\r\n",
        b"5\r\nhello\r\n0\r\nA: 1\r\nB: 2\r\n\r\n",
        b"5\r\nhello\r\n0;last=1\r\n\r\n",
        b"zz\r\nhello\r\n0\r\n\r\n",
        b"5\r\nhelloXX0\r\n\r\n",
        b"5\nhello\r\n0\r\n\r\n",
        b"11111111111111111\r\n",
        b"5 x\r\nhello\r\n0\r\n\r\n",
        b"5\r\r\nhello\r\n0\r\n\r\n",
        b"5\x0c\r\nhello\r\n0\r\n\r\n",
        b"5\r\nhello\r\n0\r\n\n",
        b"5\r\nhel",
        b"5\r\nhello\r\n0",
        b"5\r\nhello\r\n0\r\n",
        b"-5\r\nhello\r\n0\r\n\r\n",
        b";ext\r\nhello\r\n0\r\n\r\n",
        b"0x5\r\nhello\r\n0\r\n\r\n",
        b"5\r\nhello\r\n0\r\nBad Name: x\r\n\r\n",
        b"5\r\nhello\r\n0\r\n: x\r\n\r\n",
        b"5\r\nhello\r\n\r\n0\r\n\r\n",
    ]
    .iter()
    .map(|body| body.to_vec())
    .collect();
    bodies.push(STRICTER.to_vec());
    let mut long_extension = b"1;".to_vec();
    long_extension.extend(std::iter::repeat_n(b'a', 17 * 1024));
    long_extension.extend_from_slice(b"\r\nx\r\n0\r\n\r\n");
    bodies.push(long_extension);
    bodies
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_bodies_decode_as_hypers_server_decodes_them() {
    let bodies = corpus();
    let hyper = futures_util::future::join_all(bodies.iter().cloned().map(hyper_reads)).await;
    let mut disagreements = Vec::new();
    for (body, by_hyper) in bodies.iter().zip(hyper) {
        let by_decoder = decoder_reads(body);
        let agree = match (&by_hyper, &by_decoder) {
            (Ok(hyper), Ok(ours)) => hyper == ours,
            (Err(_), Err(_)) => true,
            // Refusing more than hyper, where it is meant to.
            (Ok(_), Err(_)) => body == STRICTER,
            (Err(_), Ok(_)) => false,
        };
        if !agree {
            disagreements.push(format!(
                "{:?}:\n  hyper: {by_hyper:?}\n  decoder: {by_decoder:?}",
                String::from_utf8_lossy(&body[..body.len().min(80)])
            ));
        }
    }
    assert!(
        disagreements.is_empty(),
        "the decoder and hyper's server disagree on {} of {} bodies:\n{}",
        disagreements.len(),
        bodies.len(),
        disagreements.join("\n")
    );
}
