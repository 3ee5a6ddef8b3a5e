//! `[[routes]]`: a route's path, upstream and limits, how its paths are read, and its
//! `[routes.idempotency]` table; their defaults.

use std::time::Duration;

use serde::Deserialize;

use super::fence::FenceConfig;
use super::{byte_size, duration};

/// How long a client may wait for the upstream's response head before it gets 504: long enough for a
/// slow legacy service, short enough that a hung upstream does not pin connections for minutes.
pub const DEFAULT_UPSTREAM_TIMEOUT: Duration = Duration::from_secs(30);
/// Default header carrying the idempotency key (the IETF httpapi draft's name).
pub const DEFAULT_IDEMPOTENCY_HEADER: &str = "Idempotency-Key";
/// How long outcomes are kept and replayed unless the route says otherwise (Stripe keeps 24 h).
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 3600);
/// Response bodies up to this size are stored for replay.
pub const DEFAULT_MAX_STORED_BODY: usize = 64 * 1024;
/// Request bodies up to this size are accepted on idempotent routes.
pub const DEFAULT_MAX_REQUEST_BODY: usize = 1024 * 1024;
/// Largest request body a route forwards unless it says otherwise (413 above): generous for API
/// writes, small enough that one client cannot tie up the upstream with an endless upload.
pub const DEFAULT_MAX_BODY: usize = 10 * 1024 * 1024;

/// `[[routes]]`: one path pattern in front of one upstream.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    pub name: String,
    pub path: String,
    /// The fenced methods; absent: every method but GET, HEAD, OPTIONS and TRACE.
    #[serde(default)]
    pub methods: Option<Vec<String>>,
    /// Compare the path's literal segments with the request's exactly; by default they compare
    /// ASCII-case-insensitively (fencing a case-sensitive upstream more than needed is harmless).
    #[serde(default)]
    pub case_sensitive: bool,
    /// A request path with `;` parameters on this route: refused, or stripped before matching
    /// and forwarding.
    #[serde(default)]
    pub path_parameters: PathParameters,
    /// A last path segment with a `.suffix` on this route (`/invoices/7.json`), which Rails and
    /// older Spring read as a format of `/invoices/7`: refused, or read literally.
    #[serde(default)]
    pub format_suffix: FormatSuffix,
    /// DELETE or MOVE of a path this `{*rest}` route matches, or MOVE/COPY onto one, which acts
    /// on a whole collection when the path is one: refused, or allowed (the upstream has no
    /// collections below this route).
    #[serde(default)]
    pub collection_writes: CollectionWrites,
    pub upstream: String,
    /// TLS to an `https://` upstream: trusted CAs, the verified name, a client certificate.
    #[serde(default)]
    pub upstream_tls: Option<super::UpstreamTlsConfig>,
    /// Headers set on every request to the upstream, replacing any the client sent. A value may
    /// name environment variables as `${NAME}`, read once at start (credentials the clients never
    /// hold); the values are never logged.
    #[serde(default)]
    pub upstream_headers: std::collections::BTreeMap<String, String>,
    /// Credentials the gateway obtains for the upstream itself (an OAuth2 bearer token), set as
    /// `Authorization` on every forwarded request.
    #[serde(default)]
    pub upstream_auth: Option<super::UpstreamAuthConfig>,
    /// Response headers removed before the answer goes back to the client.
    #[serde(default)]
    pub strip_response_headers: Vec<String>,
    #[serde(default)]
    pub resource_key: Option<String>,
    #[serde(default = "default_upstream_timeout", with = "duration")]
    pub timeout: Duration,
    /// Keep the client's `Forwarded` / `X-Forwarded-*` headers and append to them (only behind a
    /// trusted proxy); by default they are replaced.
    #[serde(default)]
    pub trust_forwarded: bool,
    /// Send the client's `Host` upstream instead of the upstream's own authority.
    #[serde(default)]
    pub preserve_host: bool,
    /// Largest request body forwarded; 413 above (at once when `Content-Length` says so).
    #[serde(default = "default_max_body", with = "byte_size")]
    pub max_body: usize,
    /// Open connections to this route's upstream; the smallest of `[server]`'s and those of the
    /// routes naming the same host and port applies.
    #[serde(default)]
    pub max_upstream_connections: Option<usize>,
    #[serde(default)]
    pub fence: FenceConfig,
    /// Idempotency keys and intent records for a provider that cannot be fenced.
    #[serde(default)]
    pub idempotency: Option<IdempotencyConfig>,
}

/// `[routes.idempotency]`: the same key on every attempt, and a durable intent before the call.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdempotencyConfig {
    /// The header the provider expects.
    #[serde(default = "default_idempotency_header")]
    pub header: String,
    /// Template of the key: `{resource_key}`, `{method}`, `{route}`, path segments, `{header:..}`,
    /// `{query:..}`. Never the fence, the holder or the time: every attempt sends the same key.
    pub key: String,
    /// Name of an environment variable holding a secret: the key is then derived with
    /// HMAC-SHA256(secret, rendered template) and encoded per `key_format`.
    #[serde(default)]
    pub hmac_secret_env: Option<String>,
    /// A file holding that secret instead (a mounted secret); read again on every reload.
    #[serde(default)]
    pub hmac_secret_file: Option<std::path::PathBuf>,
    /// How the key is written: the rendered template as is (`raw`), or a digest of it in `hex`,
    /// `base64url` or as a `uuid`. Default: `hex` with a secret, `raw` without.
    #[serde(default)]
    pub key_format: Option<KeyFormat>,
    /// The longest key the provider accepts. Digests are shortened to it (check-config refuses a
    /// length that leaves fewer than 128 bits, and `uuid` below 36); a longer raw or client key is
    /// refused with 400 before anything is recorded.
    #[serde(default)]
    pub max_key_length: Option<usize>,
    /// A key the client sent itself (in `header`, or where `inject` puts the key): default
    /// `replace` for a header, `refuse` for a body member.
    #[serde(default)]
    pub client_key: Option<ClientKey>,
    /// What a retry finds when an earlier attempt's outcome is unknown (timeout, reset, 5xx, a
    /// gateway that died mid-call): sent again with the same key, or held for an operator.
    #[serde(default)]
    pub on_unknown_outcome: UnknownOutcome,
    /// How long outcomes are kept and replayed.
    #[serde(default = "default_retention", with = "duration")]
    pub retention: Duration,
    /// Largest response body stored for replay; longer ones are stored without their body.
    #[serde(default = "default_max_stored_body", with = "byte_size")]
    pub max_stored_body: usize,
    /// Largest request body accepted (it is read whole to fingerprint the request); 413 above.
    #[serde(default = "default_max_request_body", with = "byte_size")]
    pub max_request_body: usize,
    /// Response headers stored and replayed with the outcome.
    #[serde(default = "default_stored_headers")]
    pub stored_headers: Vec<String>,
    /// Answers that say the provider did nothing (timed out the request, a conflicting call in
    /// flight, locked, too early, rate limited): never recorded as the outcome. The intent is
    /// released, the answer (with its `Retry-After`) passed to the client, and the next attempt
    /// goes to the provider.
    #[serde(default = "default_transient_statuses")]
    pub transient_statuses: Vec<u16>,
    /// The header with which the provider marks an answer it replayed from its own record of the
    /// key (Stripe: `Idempotent-Replayed`): passed on, and counted as the provider's replay.
    #[serde(default = "default_provider_replay_header")]
    pub provider_replay_header: String,
    /// How the key is written in its header: as it is (`bare`), or as a Structured Fields string
    /// (`sf-string`, RFC 8941: in double quotes, `"` and `\` escaped), as the IETF httpapi
    /// Idempotency-Key draft defines the field.
    #[serde(default)]
    pub key_encoding: KeyEncoding,
    /// What a request does whose key template names an input it does not carry (a header or
    /// query parameter that is absent).
    #[serde(default)]
    pub when_missing: WhenMissing,
    /// For providers that report errors inside a 2xx body (GraphQL): what the JSON body of an
    /// answer must say for it to be recorded as the outcome; any other answer releases the
    /// intent, as a transient one does.
    #[serde(default)]
    pub completed_when: Option<CompletedWhenConfig>,
    /// Where the key goes: `"header"` (the `header` above), or `"json:/pointer"`, a member of a
    /// JSON body's object (Square's `/idempotency_key`, `/variables/input/idempotencyKey`).
    #[serde(default = "default_inject")]
    pub inject: String,
}

fn default_inject() -> String {
    "header".to_owned()
}

/// `[routes.idempotency.completed_when]`: a JSON pointer (RFC 6901) into the answer's body, and
/// either `absent = true` (`/errors`) or the value it must `equals` (`/status` = `"COMPLETED"`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompletedWhenConfig {
    pub pointer: String,
    #[serde(default)]
    pub absent: bool,
    #[serde(default)]
    pub equals: Option<serde_json::Value>,
}

/// What a request does when its key template's input is absent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WhenMissing {
    /// 400 `invalid-resource-key`: nothing is forwarded.
    #[default]
    Refuse,
    /// Forwarded without a key and without an intent (its fence is still checked): for calls
    /// the provider does not need keyed.
    Passthrough,
    /// The client's own key (the route's header), if it sent one; else refused.
    ClientKey,
}

/// How an idempotency key is written in its header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum KeyEncoding {
    /// The key itself (what Stripe and most providers take).
    #[default]
    Bare,
    /// A Structured Fields string: `"payout:7"`.
    SfString,
}

/// How a derived idempotency key is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyFormat {
    /// The rendered template itself (`payout:7`); no secret.
    Raw,
    /// SHA-256 (HMAC-SHA256 with a secret) in lowercase hex: 64 characters.
    Hex,
    /// The same digest in unpadded base64url: 43 characters of `[A-Za-z0-9_-]`.
    Base64url,
    /// The digest's first 128 bits as a UUID in version-4 form (`xxxxxxxx-xxxx-4xxx-yxxx-…`):
    /// name-based in fact, so every holder derives the same one.
    Uuid,
}

/// What a retry of an intent whose outcome is unknown does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum UnknownOutcome {
    /// Send it again with the same key: right for providers that honour the key (the provider
    /// answers the repeat from its own record).
    #[default]
    Resubmit,
    /// Never send it again: repeats are refused (409 `outcome-unknown`) until an operator
    /// resolves the intent (`fencegate intents resolve`). For providers that ignore the key, where
    /// a second send could be a second charge.
    Hold,
}

/// What happens to an idempotency key the client sent itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ClientKey {
    /// Ignore it and send the derived key.
    #[default]
    Replace,
    /// Use the client's key when it sent one, else the derived key.
    Keep,
    /// The client must send one (400 otherwise); it is used as is.
    Require,
    /// A client key other than the derived one is refused (400): the client's own key is a
    /// mistake, not something to drop silently.
    Refuse,
}

/// What a route does with `;` path parameters, which Tomcat and Spring strip before routing while
/// other upstreams keep them as part of the segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PathParameters {
    /// 400 `invalid-path` when the route guards the request's method.
    #[default]
    Refuse,
    /// Remove every segment's parameters, then match, key and forward the path without them.
    Strip,
}

/// What a route does with a `.suffix` in a request's last path segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FormatSuffix {
    /// 400 `invalid-path` when the route guards the method and the path without the suffix is
    /// another resource of a guarded route.
    #[default]
    Refuse,
    /// The suffix is part of the segment (file names, dotted identifiers).
    Literal,
}

/// What a `{*rest}` route does with writes that may act on a whole collection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CollectionWrites {
    /// 403 `fenced-collection`: each resource below has a key of its own.
    #[default]
    Refuse,
    /// The upstream has no collections below this route.
    Allow,
}

fn default_max_body() -> usize {
    DEFAULT_MAX_BODY
}
fn default_upstream_timeout() -> Duration {
    DEFAULT_UPSTREAM_TIMEOUT
}
fn default_idempotency_header() -> String {
    DEFAULT_IDEMPOTENCY_HEADER.to_owned()
}
fn default_retention() -> Duration {
    DEFAULT_RETENTION
}
fn default_max_stored_body() -> usize {
    DEFAULT_MAX_STORED_BODY
}
fn default_max_request_body() -> usize {
    DEFAULT_MAX_REQUEST_BODY
}
fn default_provider_replay_header() -> String {
    "Idempotent-Replayed".to_owned()
}

fn default_transient_statuses() -> Vec<u16> {
    vec![408, 409, 423, 425, 429]
}

fn default_stored_headers() -> Vec<String> {
    vec!["content-type".to_owned(), "location".to_owned()]
}
