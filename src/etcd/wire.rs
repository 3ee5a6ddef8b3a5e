//! The messages of etcd's v3 API as its HTTP/JSON gateway reads and writes them (the protobuf JSON
//! mapping: bytes in base64, 64-bit integers as decimal strings, fields at their zero value left
//! out). Only the fields fencegate uses are declared; unknown ones in answers are ignored.

use serde::{Deserialize, Serialize};

/// A byte string, base64 on the wire.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub(crate) struct Bytes(#[serde(with = "base64_bytes")] pub(crate) Vec<u8>);

impl From<&str> for Bytes {
    fn from(text: &str) -> Bytes {
        Bytes(text.as_bytes().to_vec())
    }
}

impl From<Vec<u8>> for Bytes {
    fn from(bytes: Vec<u8>) -> Bytes {
        Bytes(bytes)
    }
}

impl From<String> for Bytes {
    fn from(text: String) -> Bytes {
        Bytes(text.into_bytes())
    }
}

impl Bytes {
    /// The bytes as text, when they are UTF-8.
    pub(crate) fn text(&self) -> Option<&str> {
        std::str::from_utf8(&self.0).ok()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

mod base64_bytes {
    use base64::Engine as _;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&base64::engine::general_purpose::STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(deserializer)?;
        base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(serde::de::Error::custom)
    }
}

/// 64-bit integers: written as decimal strings, read from strings or numbers.
mod int64 {
    use serde::{Deserialize, Deserializer, Serializer};

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Either {
        Text(String),
        Number(i64),
    }

    pub fn serialize<S: Serializer>(value: &i64, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&value.to_string())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<i64, D::Error> {
        match Either::deserialize(deserializer)? {
            Either::Number(n) => Ok(n),
            Either::Text(text) => text.parse().map_err(serde::de::Error::custom),
        }
    }
}

/// Unsigned 64-bit integers (cluster and member ids), as [`int64`].
mod uint64 {
    use serde::{Deserialize, Deserializer};

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Either {
        Text(String),
        Number(u64),
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
        match Either::deserialize(deserializer)? {
            Either::Number(n) => Ok(n),
            Either::Text(text) => text.parse().map_err(serde::de::Error::custom),
        }
    }
}

fn is_zero(value: &i64) -> bool {
    *value == 0
}

fn is_false(value: &bool) -> bool {
    !*value
}

/// Every answer's header: which cluster answered.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct Header {
    #[serde(default, deserialize_with = "uint64::deserialize")]
    pub(crate) cluster_id: u64,
    /// The cluster's revision when it answered.
    #[serde(default, with = "int64")]
    pub(crate) revision: i64,
}

/// A stored key and its value.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct KeyValue {
    #[serde(default)]
    pub(crate) key: Bytes,
    /// The revision that created the key (a lock's fencing token in etcd's recipe).
    #[serde(default, with = "int64")]
    pub(crate) create_revision: i64,
    #[serde(default, with = "int64")]
    pub(crate) mod_revision: i64,
    #[serde(default)]
    pub(crate) value: Bytes,
}

#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct RangeRequest {
    pub(crate) key: Bytes,
    /// With a range end, every key in `[key, range_end)`.
    #[serde(skip_serializing_if = "Bytes::is_empty")]
    pub(crate) range_end: Bytes,
    #[serde(skip_serializing_if = "is_zero", with = "int64")]
    pub(crate) limit: i64,
    /// Only the number of keys, not the keys.
    #[serde(skip_serializing_if = "is_false")]
    pub(crate) count_only: bool,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct RangeResponse {
    #[serde(default)]
    pub(crate) header: Header,
    #[serde(default)]
    pub(crate) kvs: Vec<KeyValue>,
    /// How many keys the range holds (all of them, whatever the limit).
    #[serde(default, with = "int64")]
    pub(crate) count: i64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct PutRequest {
    pub(crate) key: Bytes,
    pub(crate) value: Bytes,
    #[serde(skip_serializing_if = "is_zero", with = "int64")]
    pub(crate) lease: i64,
    #[serde(skip_serializing_if = "is_false")]
    pub(crate) prev_kv: bool,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct PutResponse {
    #[serde(default)]
    pub(crate) prev_kv: Option<KeyValue>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct DeleteRangeRequest {
    pub(crate) key: Bytes,
    #[serde(skip_serializing_if = "Bytes::is_empty")]
    pub(crate) range_end: Bytes,
}

/// What a comparison looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub(crate) enum Target {
    Create,
    Mod,
    Value,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub(crate) enum CompareResult {
    Equal,
    Less,
}

/// One condition of a transaction. A `Value` comparison on a key that does not exist is false.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Compare {
    pub(crate) key: Bytes,
    pub(crate) target: Target,
    pub(crate) result: CompareResult,
    #[serde(skip_serializing_if = "Option::is_none", with = "opt_int64")]
    pub(crate) create_revision: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none", with = "opt_int64")]
    pub(crate) mod_revision: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) value: Option<Bytes>,
}

mod opt_int64 {
    use serde::Serializer;

    pub fn serialize<S: Serializer>(value: &Option<i64>, serializer: S) -> Result<S::Ok, S::Error> {
        match value {
            Some(v) => serializer.serialize_str(&v.to_string()),
            None => serializer.serialize_none(),
        }
    }
}

impl Compare {
    /// The key does not exist (its create revision is 0).
    pub(crate) fn absent(key: impl Into<Bytes>) -> Compare {
        Compare {
            key: key.into(),
            target: Target::Create,
            result: CompareResult::Equal,
            create_revision: Some(0),
            mod_revision: None,
            value: None,
        }
    }

    /// The key was last written at `revision` (0: it does not exist).
    pub(crate) fn modified_at(key: impl Into<Bytes>, revision: i64) -> Compare {
        Compare {
            key: key.into(),
            target: Target::Mod,
            result: CompareResult::Equal,
            create_revision: None,
            mod_revision: Some(revision),
            value: None,
        }
    }

    /// The key's value is exactly `value`.
    pub(crate) fn value_is(key: impl Into<Bytes>, value: impl Into<Bytes>) -> Compare {
        Compare {
            key: key.into(),
            target: Target::Value,
            result: CompareResult::Equal,
            create_revision: None,
            mod_revision: None,
            value: Some(value.into()),
        }
    }

    /// The key exists and its value orders before `value`, byte by byte.
    pub(crate) fn value_below(key: impl Into<Bytes>, value: impl Into<Bytes>) -> Compare {
        Compare {
            result: CompareResult::Less,
            ..Compare::value_is(key, value)
        }
    }
}

/// One operation of a transaction.
#[derive(Debug, Clone, Serialize)]
pub(crate) enum RequestOp {
    #[serde(rename = "request_range")]
    Range(RangeRequest),
    #[serde(rename = "request_put")]
    Put(PutRequest),
    #[serde(rename = "request_delete_range")]
    DeleteRange(DeleteRangeRequest),
    #[serde(rename = "request_txn")]
    Txn(TxnRequest),
}

impl RequestOp {
    /// A read of one key.
    pub(crate) fn read(key: &str) -> RequestOp {
        RequestOp::Range(RangeRequest {
            key: key.into(),
            ..Default::default()
        })
    }
}

/// The answer to one [`RequestOp`], in the same position.
#[derive(Debug, Clone, Deserialize)]
pub(crate) enum ResponseOp {
    #[serde(rename = "response_range")]
    Range(RangeResponse),
    #[serde(rename = "response_put")]
    Put(PutResponse),
    /// Nothing of it is read.
    #[serde(rename = "response_delete_range")]
    DeleteRange(serde::de::IgnoredAny),
    #[serde(rename = "response_txn")]
    Txn(TxnResponse),
}

/// If every comparison holds, `success` runs, else `failure`; atomically, as one revision.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct TxnRequest {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) compare: Vec<Compare>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) success: Vec<RequestOp>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) failure: Vec<RequestOp>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct TxnResponse {
    #[serde(default)]
    pub(crate) header: Header,
    #[serde(default)]
    pub(crate) succeeded: bool,
    #[serde(default)]
    pub(crate) responses: Vec<ResponseOp>,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct LeaseGrantRequest {
    #[serde(rename = "TTL", with = "int64")]
    pub(crate) ttl: i64,
}

#[derive(Debug, Clone, Deserialize)]
pub(crate) struct LeaseGrantResponse {
    #[serde(default)]
    pub(crate) header: Header,
    #[serde(rename = "ID", default, with = "int64")]
    pub(crate) id: i64,
    #[serde(rename = "TTL", default, with = "int64")]
    pub(crate) ttl: i64,
    #[serde(default)]
    pub(crate) error: String,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct AuthenticateRequest {
    pub(crate) name: String,
    pub(crate) password: String,
}

#[derive(Debug, Clone, Deserialize)]
pub(crate) struct AuthenticateResponse {
    #[serde(default)]
    pub(crate) token: String,
}

/// What the gateway answers with a non-2xx status: a gRPC status code and message.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct ErrorBody {
    #[serde(default)]
    pub(crate) code: i32,
    #[serde(default)]
    pub(crate) message: String,
    #[serde(default)]
    pub(crate) error: String,
}

/// `/v3/watch`: follow every change to `[key, range_end)` from `start_revision` on.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct WatchRequest {
    pub(crate) create_request: WatchCreateRequest,
}

#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct WatchCreateRequest {
    pub(crate) key: Bytes,
    #[serde(skip_serializing_if = "Bytes::is_empty")]
    pub(crate) range_end: Bytes,
    #[serde(skip_serializing_if = "is_zero", with = "int64")]
    pub(crate) start_revision: i64,
    /// Ask for empty answers now and then, so an idle watch's revision moves too.
    #[serde(skip_serializing_if = "is_false")]
    pub(crate) progress_notify: bool,
}

/// One streamed answer of a watch: `{"result": ...}`, or `{"error": ...}` when it broke.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct WatchAnswer {
    #[serde(default)]
    pub(crate) result: Option<WatchResponse>,
    #[serde(default)]
    pub(crate) error: Option<ErrorBody>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct WatchResponse {
    #[serde(default)]
    pub(crate) header: Header,
    /// The watch's first answer: its header's revision says nothing of events applied.
    #[serde(default)]
    pub(crate) created: bool,
    #[serde(default)]
    pub(crate) canceled: bool,
    /// Set when the start revision was compacted away: the watch must start over.
    #[serde(default, with = "int64")]
    pub(crate) compact_revision: i64,
    #[serde(default)]
    pub(crate) cancel_reason: String,
    #[serde(default)]
    pub(crate) events: Vec<Event>,
}

/// A key's change; a put when the type is left out.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct Event {
    #[serde(default, rename = "type")]
    pub(crate) kind: EventKind,
    #[serde(default)]
    pub(crate) kv: KeyValue,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub(crate) enum EventKind {
    #[default]
    #[serde(rename = "PUT")]
    Put,
    #[serde(rename = "DELETE")]
    Delete,
}

/// The end of the range of every key starting with `prefix`: the prefix with its last byte
/// below 0xff raised by one (empty, meaning "to the end", when there is none).
pub(crate) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// A response with nothing fencegate reads but its header.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct Empty {
    #[serde(default)]
    pub(crate) header: Header,
}

/// Answers carrying the header whose cluster id the client checks.
pub(crate) trait HasHeader {
    fn header(&self) -> &Header;
}

impl HasHeader for TxnResponse {
    fn header(&self) -> &Header {
        &self.header
    }
}

impl HasHeader for RangeResponse {
    fn header(&self) -> &Header {
        &self.header
    }
}

impl HasHeader for LeaseGrantResponse {
    fn header(&self) -> &Header {
        &self.header
    }
}

impl HasHeader for Empty {
    fn header(&self) -> &Header {
        &self.header
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nested_transaction_serializes_as_the_gateway_reads_it() {
        let txn = TxnRequest {
            compare: vec![Compare::absent("k")],
            success: vec![RequestOp::Put(PutRequest {
                key: "k".into(),
                value: "v".into(),
                lease: 0,
                prev_kv: true,
            })],
            failure: vec![RequestOp::Txn(TxnRequest {
                compare: vec![Compare::value_below("k", "v")],
                success: vec![],
                failure: vec![RequestOp::Range(RangeRequest {
                    key: "k".into(),
                    ..Default::default()
                })],
            })],
        };
        let json = serde_json::to_value(&txn).expect("json");
        assert_eq!(
            json,
            serde_json::json!({
                "compare": [{"key": "aw==", "target": "CREATE", "result": "EQUAL", "create_revision": "0"}],
                "success": [{"request_put": {"key": "aw==", "value": "dg==", "prev_kv": true}}],
                "failure": [{"request_txn": {
                    "compare": [{"key": "aw==", "target": "VALUE", "result": "LESS", "value": "dg=="}],
                    "failure": [{"request_range": {"key": "aw=="}}]
                }}]
            })
        );
    }

    #[test]
    fn a_watch_answer_reads_its_events() {
        let text = r#"{"result":{"header":{"cluster_id":"1","revision":"9"},"events":[
            {"kv":{"key":"bC9hL2I=","create_revision":"9","mod_revision":"9","version":"1"}},
            {"type":"DELETE","kv":{"key":"bC9hL2M=","mod_revision":"9"}}]}}"#;
        let answer: WatchAnswer = serde_json::from_str(text).expect("parses");
        let result = answer.result.expect("a result");
        assert_eq!(result.header.revision, 9);
        assert_eq!(result.events[0].kind, EventKind::Put);
        assert_eq!(result.events[0].kv.create_revision, 9);
        assert_eq!(result.events[1].kind, EventKind::Delete);
        assert_eq!(prefix_end(b"l/a/"), b"l/a0".to_vec());
        assert_eq!(prefix_end(&[b'a', 0xff]), b"b".to_vec());
    }

    #[test]
    fn answers_read_with_zero_fields_left_out() {
        let text = r#"{"header":{"cluster_id":"324952591200643719","revision":"2"},
            "responses":[{"response_txn":{"header":{},"responses":[{"response_range":
            {"header":{"revision":"2"},"kvs":[{"key":"bWFyay9h","create_revision":"2",
            "mod_revision":"2","version":"1","value":"MDAwMDAwMDAwMDAwMDAwMDAwMDU="}],"count":"1"}}]}}]}"#;
        let answer: TxnResponse = serde_json::from_str(text).expect("parses");
        assert!(!answer.succeeded);
        assert_eq!(answer.header.cluster_id, 324_952_591_200_643_719);
        let Some(ResponseOp::Txn(inner)) = answer.responses.first() else {
            panic!("a nested answer: {answer:?}");
        };
        let Some(ResponseOp::Range(range)) = inner.responses.first() else {
            panic!("a range: {inner:?}");
        };
        assert_eq!(range.kvs[0].value.text(), Some("00000000000000000005"));
        assert_eq!(range.kvs[0].mod_revision, 2);
    }
}
