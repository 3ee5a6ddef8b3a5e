//! Connecting to the server (and how long connecting and each answer may take), and loading
//! fencegate's scripts on a connection.

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, RedisError, Script};

use super::intents::IntentScripts;
use super::turn_scripts::TurnScripts;
use crate::config::DEFAULT_STORE_TIMEOUT;

/// How long opening waits for the server: an unreachable host fails start-up with a clear error
/// instead of hanging on the operating system's TCP timeout.
pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the writer waits to reconnect after losing the server: no longer than a caller waits
/// for the store by default, so a dead server answers each batch with an error promptly.
pub(super) const RECONNECT_TIMEOUT: Duration = DEFAULT_STORE_TIMEOUT;
/// How long one pipeline may wait for its answers before the batch fails and the connection is
/// replaced: covers a slow `appendfsync always` disk, not a hung server.
pub(super) const RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);

/// Connects (TCP, handshake, `AUTH`/`SELECT` from the URL) within `timeout`; every later request
/// on the connection is bounded by [`RESPONSE_TIMEOUT`].
pub(super) async fn connect(
    client: &redis::Client,
    timeout: Duration,
) -> Result<MultiplexedConnection, RedisError> {
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(RESPONSE_TIMEOUT));
    match tokio::time::timeout(
        timeout,
        client.get_multiplexed_async_connection_with_config(&config),
    )
    .await
    {
        Ok(connection) => connection,
        Err(_) => Err(RedisError::from(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "connecting timed out",
        ))),
    }
}

/// Loads the advance script and the intent scripts into the server's script cache.
pub(super) async fn load_scripts(
    connection: &mut MultiplexedConnection,
    advance: &Script,
    intents: &IntentScripts,
    turns: &TurnScripts,
) -> Result<(), RedisError> {
    for script in std::iter::once(advance)
        .chain(intents.all())
        .chain(turns.all())
    {
        script.load_async(connection).await?;
    }
    Ok(())
}
