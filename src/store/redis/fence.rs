//! `FenceStore` for `RedisStore`: each call a command for the calling thread's writer.

use super::command::Command;
use super::error::BACKEND;
use super::RedisStore;
use crate::config::Compare;
use crate::store::plumbing::mailbox;
use crate::store::{Advance, FenceStore, StoreFuture, StoreIdentity};

impl FenceStore for RedisStore {
    fn advance(&self, key: &str, token: u64, compare: Compare) -> StoreFuture<'_, Advance> {
        let key = key.to_owned();
        Box::pin(self.request(move |reply| Command::Advance {
            key,
            token,
            compare,
            reply,
        }))
    }

    fn current(&self, key: &str) -> StoreFuture<'_, Option<u64>> {
        let key = key.to_owned();
        Box::pin(self.request(move |reply| Command::Current { key, reply }))
    }

    fn identity(&self) -> StoreFuture<'_, StoreIdentity> {
        Box::pin(self.request(|reply| Command::Identity { reply }))
    }

    fn expect_identity(&self, id: &str) {
        self.expected.set(id);
    }

    fn close(&self) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            for writer in self.writers.writers.close() {
                mailbox::close(&writer, |reply| Command::Close { reply }).await;
            }
            Ok(())
        })
    }

    fn backend(&self) -> &'static str {
        BACKEND
    }
}
