//! One round trip of a writer: its batch as one pipeline, on its connection (made again when it
//! has none).

use redis::{RedisError, Value};

use super::command::Command;
use super::connection::{connect, load_scripts, RECONNECT_TIMEOUT};
use super::keys::{mark_key, store_id_key};
use super::script::{compare_arg, unexpected};
use super::writer::Writer;
use crate::store::new_store_id;

impl Writer {
    /// One pipeline: every advance in one `EVALSHA` of the advance script (when there is any),
    /// then each other command in order: a read is one `GET`, an identity `SET NX` then `GET`, a
    /// group its commands. Per-command server errors come back as values; an error here means the
    /// connection failed and the outcome of the batch is unknown.
    pub(super) async fn round_trip(
        &mut self,
        advances: &[Command],
        others: &[Command],
    ) -> Result<Vec<Value>, RedisError> {
        let mut connection = match &self.connection {
            Some(connection) => connection.clone(),
            None => {
                let mut fresh = connect(&self.client, RECONNECT_TIMEOUT).await?;
                if self.lost_connection {
                    tracing::info!(url = %self.url, "redis store reconnected");
                } else {
                    tracing::debug!(url = %self.url, "redis store writer connected");
                }
                load_scripts(
                    &mut fresh,
                    &self.script,
                    &self.intent_scripts,
                    &self.turn_scripts,
                )
                .await?;
                self.connection = Some(fresh.clone());
                fresh
            }
        };
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        let mut expected = 0;
        if !advances.is_empty() {
            let mut invocation = self.script.prepare_invoke();
            let adopted = self.expected.get();
            invocation
                .key(store_id_key(&self.prefix))
                .arg(adopted.as_deref().unwrap_or_default());
            for command in advances {
                if let Command::Advance {
                    key,
                    token,
                    compare,
                    ..
                } = command
                {
                    invocation
                        .key(mark_key(&self.prefix, key))
                        .arg(token.to_string())
                        .arg(compare_arg(*compare));
                }
            }
            pipe.invoke_script(&invocation);
            expected += 1;
        }
        for command in others {
            match command {
                Command::Current { key, .. } => {
                    pipe.get(mark_key(&self.prefix, key));
                    expected += 1;
                }
                Command::Identity { .. } => {
                    let key = store_id_key(&self.prefix);
                    pipe.cmd("SET").arg(&key).arg(new_store_id()).arg("NX");
                    pipe.get(key);
                    expected += 2;
                }
                Command::Commands { commands, .. } | Command::Forget { commands } => {
                    for command in commands {
                        pipe.add_command(command.clone());
                    }
                    expected += commands.len();
                }
                Command::Advance { .. } | Command::Close { .. } => {}
            }
        }
        let answer = pipe.query_async::<Vec<Value>>(&mut connection).await;
        match answer {
            Ok(replies) if replies.len() == expected => Ok(replies),
            Ok(replies) => {
                self.connection = None;
                self.lost_connection = true;
                Err(unexpected(format!(
                    "a pipeline of {expected} commands got {} answers",
                    replies.len()
                )))
            }
            Err(e) => {
                self.connection = None;
                self.lost_connection = true;
                Err(e)
            }
        }
    }
}
