//! A route's `[routes.idempotency]` table, compiled: header name, key template, HMAC secret (read
//! from the environment once, at start), limits and the headers stored for replay.

use std::time::Duration;

use http::HeaderName;

use super::{KeyTemplate, PathPattern};
use crate::config::{
    ClientKey, CompletedWhenConfig, IdempotencyConfig, KeyEncoding, KeyFormat, UnknownOutcome,
    WhenMissing,
};

/// Names a key template may use besides the path's segments.
pub const TEMPLATE_EXTRAS: [&str; 3] = ["resource_key", "method", "route"];

#[derive(Debug)]
pub struct IdempotencySettings {
    pub header: HeaderName,
    pub key: KeyTemplate,
    pub hmac_secret: Option<Vec<u8>>,
    pub key_format: KeyFormat,
    /// The longest key the provider takes: digests are cut to it, longer raw or client keys
    /// refused.
    pub max_key_length: Option<usize>,
    pub client_key: ClientKey,
    pub on_unknown_outcome: UnknownOutcome,
    pub retention: Duration,
    pub max_stored_body: usize,
    pub max_request_body: usize,
    pub stored_headers: Vec<HeaderName>,
    /// Answers that are not outcomes: the provider did nothing, so the intent is released.
    pub transient_statuses: Vec<http::StatusCode>,
    /// The header the provider marks its own replays with.
    pub provider_replay_header: HeaderName,
    /// How the key is written in its header.
    pub key_encoding: KeyEncoding,
    /// What a request whose key input is absent does.
    pub when_missing: WhenMissing,
    /// What an answer's JSON body must say to be recorded as the outcome.
    pub completed_when: Option<CompletedWhen>,
    /// Where the key is put in the forwarded request.
    pub inject: Inject,
}

/// Where an idempotency key goes in the forwarded request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Inject {
    /// The route's `header`.
    Header,
    /// A member of a JSON body's object, named by this pointer (`/idempotency_key`,
    /// `/variables/input/idempotencyKey`).
    Json(String),
}

impl Inject {
    fn parse(text: &str) -> Result<Inject, String> {
        if text == "header" {
            return Ok(Inject::Header);
        }
        match text.strip_prefix("json:") {
            Some(pointer)
                if pointer.starts_with('/') && pointer[1..].split('/').all(|t| !t.is_empty()) =>
            {
                Ok(Inject::Json(pointer.to_owned()))
            }
            _ => Err(format!(
                "{text:?}: use \"header\" or \"json:/pointer\" (a member of a JSON body's object, e.g. \"json:/idempotency_key\" or \"json:/variables/input/idempotencyKey\")"
            )),
        }
    }
}

/// `completed_when`, compiled: where to look in an answer's JSON body, and what must be there.
#[derive(Debug, Clone, PartialEq)]
pub struct CompletedWhen {
    pointer: String,
    expect: Expected,
}

#[derive(Debug, Clone, PartialEq)]
enum Expected {
    Absent,
    Equals(serde_json::Value),
}

impl CompletedWhen {
    fn compile(config: &CompletedWhenConfig) -> Result<CompletedWhen, String> {
        if !(config.pointer.is_empty() || config.pointer.starts_with('/')) {
            return Err(format!(
                "pointer {:?} is not a JSON pointer (RFC 6901: empty, or starting with '/')",
                config.pointer
            ));
        }
        let expect = match (config.absent, &config.equals) {
            (true, None) => Expected::Absent,
            (false, Some(value)) => Expected::Equals(value.clone()),
            _ => return Err("set exactly one of `absent = true` and `equals = VALUE`".to_owned()),
        };
        Ok(CompletedWhen {
            pointer: config.pointer.clone(),
            expect,
        })
    }

    /// Whether `body` is a JSON document that says the provider completed the call. A body that
    /// is not JSON says nothing of the kind.
    pub fn holds(&self, body: &[u8]) -> bool {
        let Ok(document) = serde_json::from_slice::<serde_json::Value>(body) else {
            return false;
        };
        let found = document.pointer(&self.pointer);
        match &self.expect {
            Expected::Absent => found.is_none_or(serde_json::Value::is_null),
            Expected::Equals(value) => found == Some(value),
        }
    }
}

impl IdempotencySettings {
    /// Whether an answer with `status` says the provider did nothing (no outcome to record).
    pub fn is_transient(&self, status: http::StatusCode) -> bool {
        self.transient_statuses.contains(&status)
    }
}

/// Why a table did not compile: the field (below `idempotency.`) and the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettingsError {
    pub field: &'static str,
    pub message: String,
}

/// Headers that describe how the original message was framed or carried (its length, its
/// transfer coding, its connection), never what the provider answered: a replayed outcome has
/// its own framing, so they are neither stored nor recorded by an operator nor replayed.
const FRAMING_HEADERS: [&str; 8] = [
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "upgrade",
];

/// Whether a header of a recorded outcome may be replayed (`name` in lowercase).
pub fn is_replayable_header(name: &str) -> bool {
    !FRAMING_HEADERS.contains(&name)
}

impl IdempotencySettings {
    pub fn compile(
        config: &IdempotencyConfig,
        pattern: &PathPattern,
    ) -> Result<IdempotencySettings, SettingsError> {
        let error = |field, message: String| SettingsError { field, message };
        let header = HeaderName::from_bytes(config.header.as_bytes())
            .map_err(|_| error("idempotency.header", "not a valid header name".to_owned()))?;
        let names = pattern.param_names().chain(TEMPLATE_EXTRAS);
        let key = KeyTemplate::parse(&config.key, names)
            .map_err(|e| error("idempotency.key", e.to_string()))?;
        let hmac_secret = crate::config::secret::read(
            "hmac_secret",
            config.hmac_secret_env.as_deref(),
            config.hmac_secret_file.as_deref(),
        )
        .map_err(|e| {
            let field = if config.hmac_secret_file.is_some() {
                "idempotency.hmac_secret_file"
            } else {
                "idempotency.hmac_secret_env"
            };
            error(field, e.to_string())
        })?
        .map(String::into_bytes);
        let key_format = match (config.key_format, &hmac_secret) {
            (Some(KeyFormat::Raw), Some(_)) => {
                return Err(error(
                    "idempotency.key_format",
                    "\"raw\" sends the rendered template itself; with hmac_secret_env use \"hex\", \"base64url\" or \"uuid\"".to_owned(),
                ))
            }
            (Some(format), _) => format,
            (None, Some(_)) => KeyFormat::Hex,
            (None, None) => KeyFormat::Raw,
        };
        if let Some(max) = config.max_key_length {
            let shortest = shortest_length(key_format);
            if max < shortest {
                let why = match key_format {
                    KeyFormat::Uuid => "a UUID is 36 characters and cannot be shortened".to_owned(),
                    KeyFormat::Raw => "a key needs at least one character".to_owned(),
                    _ => format!(
                        "{} keys shorter than {shortest} characters carry fewer than 128 bits",
                        format_name(key_format)
                    ),
                };
                return Err(error(
                    "idempotency.max_key_length",
                    format!(
                        "{max} is too short for key_format = {:?}: {why}",
                        format_name(key_format)
                    ),
                ));
            }
        }
        let stored_headers = config
            .stored_headers
            .iter()
            .map(|h| {
                let name = HeaderName::from_bytes(h.as_bytes()).map_err(|_| {
                    error(
                        "idempotency.stored_headers",
                        format!("{h:?} is not a header name"),
                    )
                })?;
                if !is_replayable_header(name.as_str()) {
                    return Err(error(
                        "idempotency.stored_headers",
                        format!("{h:?} frames the message it came with; a replay sets its own"),
                    ));
                }
                Ok(name)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let transient_statuses = config
            .transient_statuses
            .iter()
            .map(|&code| match http::StatusCode::from_u16(code) {
                Ok(status) if status.is_client_error() => Ok(status),
                _ => Err(error(
                    "idempotency.transient_statuses",
                    format!("{code} is not a 4xx status: a 5xx answer is already an unknown outcome, and a 1xx, 2xx or 3xx one an outcome"),
                )),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let provider_replay_header =
            HeaderName::from_bytes(config.provider_replay_header.as_bytes()).map_err(|_| {
                error(
                    "idempotency.provider_replay_header",
                    "not a valid header name".to_owned(),
                )
            })?;
        let completed_when = config
            .completed_when
            .as_ref()
            .map(CompletedWhen::compile)
            .transpose()
            .map_err(|message| error("idempotency.completed_when", message))?;
        let inject = Inject::parse(&config.inject)
            .map_err(|message| error("idempotency.inject", message))?;
        Ok(IdempotencySettings {
            inject: inject.clone(),
            completed_when,
            when_missing: config.when_missing,
            key_encoding: config.key_encoding,
            provider_replay_header,
            transient_statuses,
            header,
            key,
            hmac_secret,
            key_format,
            max_key_length: config.max_key_length,
            client_key: config.client_key.unwrap_or(match inject {
                Inject::Header => ClientKey::Replace,
                Inject::Json(_) => ClientKey::Refuse,
            }),
            on_unknown_outcome: config.on_unknown_outcome,
            retention: config.retention,
            max_stored_body: config.max_stored_body,
            max_request_body: config.max_request_body,
            stored_headers,
        })
    }
}

/// The fewest characters of `format` that still carry 128 bits (a UUID cannot be cut at all).
pub fn shortest_length(format: KeyFormat) -> usize {
    match format {
        KeyFormat::Raw => 1,
        KeyFormat::Hex => 32,
        KeyFormat::Base64url => 22,
        KeyFormat::Uuid => 36,
    }
}
/// The name of a format as the configuration writes it.
pub fn format_name(format: KeyFormat) -> &'static str {
    match format {
        KeyFormat::Raw => "raw",
        KeyFormat::Hex => "hex",
        KeyFormat::Base64url => "base64url",
        KeyFormat::Uuid => "uuid",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn compile(table: &str) -> Result<IdempotencySettings, SettingsError> {
        let config: IdempotencyConfig = toml::from_str(table).expect("table");
        IdempotencySettings::compile(&config, &PathPattern::parse("/p/{id}").expect("pattern"))
    }

    #[test]
    fn completed_when_reads_the_answers_json_body() {
        let absent =
            compile("key = \"p:{id}\"\n[completed_when]\npointer = \"/errors\"\nabsent = true")
                .expect("settings")
                .completed_when
                .expect("rule");
        assert!(absent.holds(br#"{"data":{"charge":"ch_1"}}"#));
        assert!(absent.holds(br#"{"data":{},"errors":null}"#));
        assert!(!absent.holds(br#"{"errors":[{"message":"declined"}]}"#));
        assert!(!absent.holds(b"not json"));
        let equals = compile(
            "key = \"p:{id}\"\n[completed_when]\npointer = \"/status\"\nequals = \"COMPLETED\"",
        )
        .expect("settings")
        .completed_when
        .expect("rule");
        assert!(equals.holds(br#"{"status":"COMPLETED"}"#));
        assert!(!equals.holds(br#"{"status":"FAILED"}"#));
        assert!(!equals.holds(br#"{}"#));
        for bad in [
            "pointer = \"errors\"\nabsent = true",
            "pointer = \"/errors\"",
            "pointer = \"/s\"\nabsent = true\nequals = 1",
        ] {
            let error = compile(&format!("key = \"p:{{id}}\"\n[completed_when]\n{bad}"))
                .expect_err("refused");
            assert_eq!(error.field, "idempotency.completed_when", "{bad}");
        }
    }

    #[test]
    fn transient_statuses_default_to_the_answers_of_a_provider_that_did_nothing() {
        let settings = compile("key = \"p:{id}\"").expect("settings");
        for code in [408, 409, 423, 425, 429] {
            let status = http::StatusCode::from_u16(code).expect("status");
            assert!(settings.is_transient(status), "{code}");
        }
        for code in [200, 201, 400, 402, 404, 422, 500] {
            let status = http::StatusCode::from_u16(code).expect("status");
            assert!(!settings.is_transient(status), "{code}");
        }
        let none = compile("key = \"p:{id}\"\ntransient_statuses = []").expect("settings");
        assert!(!none.is_transient(http::StatusCode::TOO_MANY_REQUESTS));
        for bad in ["[500]", "[200]", "[99]", "[429, 503]"] {
            let error = compile(&format!("key = \"p:{{id}}\"\ntransient_statuses = {bad}"))
                .expect_err("refused");
            assert_eq!(error.field, "idempotency.transient_statuses", "{bad}");
        }
    }
}
