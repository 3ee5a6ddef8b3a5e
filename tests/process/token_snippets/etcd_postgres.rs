//! The etcd lock and PostgreSQL lease snippets (etcd at 127.0.0.1:2379, PostgreSQL at
//! 127.0.0.1:5432 and psycopg), by the marks alone and followed by the authority watch.

use super::{
    holder_followed_by_the_authority_watch, require_python_module, two_holders_then_a_zombie,
    PYTHON_INSTALL,
};
use crate::support::etcd;
use crate::support::postgres::{connect, drop_schema, unique_schema, TEST_POSTGRES_URL};

#[tokio::test]
async fn etcd_lock_snippet_writes_with_its_keys_create_revision() {
    etcd::with_prefix(|prefix| async move {
        let lock = format!("{prefix}locks/invoice/42");
        let args = |url: String| {
            vec![
                url,
                "--etcd".to_owned(),
                etcd::etcd_url(),
                "--lock".to_owned(),
                lock.clone(),
            ]
        };
        two_holders_then_a_zombie("etcd_lock.py", args).await;
        // Both released: revoking the lease deleted each holder's key.
        assert_eq!(
            etcd::keys_under(&format!("{lock}/")).await,
            Vec::<String>::new()
        );
    })
    .await;
}

#[tokio::test]
async fn postgres_lease_snippet_writes_with_the_rows_fence() {
    require_python_module("psycopg", PYTHON_INSTALL);
    let schema = unique_schema();
    let mut connection = connect().await;
    sqlx::query(&format!("CREATE SCHEMA {schema}"))
        .execute(&mut connection)
        .await
        .expect("create the test schema");
    let table = format!("{schema}.lock_leases");
    let args = move |url: String| {
        vec![
            url,
            "--dsn".to_owned(),
            TEST_POSTGRES_URL.to_owned(),
            "--table".to_owned(),
            table.clone(),
        ]
    };
    let outcome =
        tokio::spawn(async move { two_holders_then_a_zombie("pg_lease.py", args).await }).await;
    let row: Result<(i64, bool), sqlx::Error> = sqlx::query_as(&format!(
        "SELECT fence, expires_at <= now() FROM {schema}.lock_leases WHERE lock_key = 'locks/invoice/42'"
    ))
    .fetch_one(&mut connection)
    .await;
    drop_schema(&schema).await;
    if let Err(e) = outcome {
        std::panic::resume_unwind(e.into_panic());
    }
    // The row keeps its counter, and the second holder's lease was released (expired).
    assert_eq!(row.expect("the lease row"), (2, true));
}

#[tokio::test]
async fn etcd_lock_snippet_is_followed_by_the_authority_watch() {
    etcd::with_prefix(|prefix| async move {
        let authority = format!(
            "kind = \"etcd\"\nendpoints = [\"{}\"]\nlock_key = \"{prefix}locks/invoice/{{id}}\"\n",
            etcd::etcd_url()
        );
        let lock = format!("{prefix}locks/invoice/42");
        let args = |url: String| {
            vec![
                url,
                "--etcd".to_owned(),
                etcd::etcd_url(),
                "--lock".to_owned(),
                lock.clone(),
            ]
        };
        holder_followed_by_the_authority_watch("etcd_lock.py", &authority, args).await;
    })
    .await;
}

#[tokio::test]
async fn postgres_lease_snippet_is_followed_by_the_authority_watch() {
    require_python_module("psycopg", PYTHON_INSTALL);
    let schema = unique_schema();
    let mut connection = connect().await;
    // The table exists before the gateway starts following it.
    for statement in [
        format!("CREATE SCHEMA {schema}"),
        format!(
            "CREATE TABLE {schema}.lock_leases (lock_key text PRIMARY KEY, owner text NOT NULL, \
             fence bigint NOT NULL, expires_at timestamptz NOT NULL)"
        ),
    ] {
        sqlx::query(&statement)
            .execute(&mut connection)
            .await
            .expect("create the lease table");
    }
    let table = format!("{schema}.lock_leases");
    let authority = format!(
        "kind = \"postgres\"\nurl = \"{TEST_POSTGRES_URL}\"\ntable = \"{table}\"\nlock_key = \"locks/invoice/{{id}}\"\n"
    );
    let args = move |url: String| {
        vec![
            url,
            "--dsn".to_owned(),
            TEST_POSTGRES_URL.to_owned(),
            "--table".to_owned(),
            table.clone(),
        ]
    };
    let outcome = tokio::spawn(async move {
        holder_followed_by_the_authority_watch("pg_lease.py", &authority, args).await
    })
    .await;
    drop_schema(&schema).await;
    if let Err(e) = outcome {
        std::panic::resume_unwind(e.into_panic());
    }
}
