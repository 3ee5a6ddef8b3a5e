//! A worker that takes a lease in a PostgreSQL lease table and writes through fencegate with the
//! lease's fencing token, renewing the lease, until the gateway refuses it or the lease is gone
//! (docs/getting-tokens.md).
//!
//! ```text
//! cargo run --release --example pg_lease_worker -- GATEWAY_URL [--dsn URL] [--table NAME] [--lock KEY]
//!                                        [--ttl SECONDS] [--every MILLIS] [--writes N]
//! cargo run --release --example pg_lease_worker -- http://127.0.0.1:8080/invoices/42 --writes 5
//! ```
//!
//! One row per lock; acquiring a free or expired lease raises the row's `fence` in the same
//! statement, and that `fence` is the token. Releasing expires the lease but keeps the row, so the
//! counter never restarts. Prints `token=N`, then `status=N` per write. Exits 0 after `--writes`
//! writes, 1 when it lost the lease (a write refused, a renewal that found it gone).

use std::process::ExitCode;
use std::time::Duration;

use http_body_util::BodyExt as _;
use sqlx::PgPool;

type Failure = Box<dyn std::error::Error + Send + Sync>;

/// How often a waiting contender tries to acquire again.
const ACQUIRE_POLL: Duration = Duration::from_millis(200);

const CREATE: &str = "CREATE TABLE IF NOT EXISTS {table} (
    lock_key   text        PRIMARY KEY,
    owner      text        NOT NULL,
    fence      bigint      NOT NULL,
    expires_at timestamptz NOT NULL)";

const ACQUIRE: &str = "INSERT INTO {table} AS l (lock_key, owner, fence, expires_at)
    VALUES ($1, $2, 1, now() + make_interval(secs => $3))
    ON CONFLICT (lock_key) DO UPDATE
        SET owner = EXCLUDED.owner, fence = l.fence + 1, expires_at = EXCLUDED.expires_at
        WHERE l.expires_at <= now()
    RETURNING fence";

const RENEW: &str = "UPDATE {table} SET expires_at = now() + make_interval(secs => $3)
    WHERE lock_key = $1 AND fence = $2 AND expires_at > now()";

const RELEASE: &str = "UPDATE {table} SET expires_at = now() WHERE lock_key = $1 AND fence = $2";

struct Args {
    gateway_url: String,
    dsn: String,
    /// Interpolated into the SQL: a table name of the operator's, never a request's input.
    table: String,
    lock: String,
    ttl_secs: f64,
    every: Duration,
    writes: Option<u64>,
}

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("pg_lease_worker: {e}");
            ExitCode::from(2)
        }
    }
}

async fn run() -> Result<ExitCode, Failure> {
    let args = parse_args()?;
    let pool = PgPool::connect(&args.dsn).await?;
    let sql = |text: &str| text.replace("{table}", &args.table);
    sqlx::query(&sql(CREATE)).execute(&pool).await?;
    let owner = format!("pg_lease_worker:{}", std::process::id());
    let fence: i64 = loop {
        let row: Option<(i64,)> = sqlx::query_as(&sql(ACQUIRE))
            .bind(&args.lock)
            .bind(&owner)
            .bind(args.ttl_secs)
            .fetch_optional(&pool)
            .await?;
        match row {
            Some((fence,)) => break fence,
            None => tokio::time::sleep(ACQUIRE_POLL).await, // held, and not expired yet
        }
    };
    println!("token={fence}");
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http();
    let mut written = 0u64;
    let mut ticks = tokio::time::interval(args.every);
    let code = loop {
        if args.writes.is_some_and(|n| written >= n) {
            break ExitCode::SUCCESS;
        }
        ticks.tick().await;
        // Renew before each write (`--every` well below the TTL): zero rows means the lease
        // ended. A write already on its way is still fenced by the gateway.
        let renewed = sqlx::query(&sql(RENEW))
            .bind(&args.lock)
            .bind(fence)
            .bind(args.ttl_secs)
            .execute(&pool)
            .await?;
        if renewed.rows_affected() != 1 {
            eprintln!("pg_lease_worker: lease {fence} ended; stopping");
            break ExitCode::FAILURE;
        }
        let request = http::Request::put(&args.gateway_url)
            .header("x-fence", fence.to_string())
            .body(http_body_util::Full::new(bytes::Bytes::from(format!(
                "write {written} under token {fence}"
            ))))?;
        let response = http.request(request).await?;
        let status = response.status();
        let answer = response.into_body().collect().await?.to_bytes();
        println!("status={}", status.as_u16());
        written += 1;
        if status.is_client_error() {
            // 409 stale-fence: a newer holder exists. Never retry with this token.
            let answer = String::from_utf8_lossy(&answer);
            eprintln!("pg_lease_worker: refused, stopping: {answer}");
            break ExitCode::FAILURE;
        }
    };
    sqlx::query(&sql(RELEASE))
        .bind(&args.lock)
        .bind(fence)
        .execute(&pool)
        .await?;
    pool.close().await;
    Ok(code)
}

fn parse_args() -> Result<Args, Failure> {
    let mut args = std::env::args().skip(1);
    let mut parsed = Args {
        gateway_url: String::new(),
        dsn: "postgres://postgres@127.0.0.1:5432/test".to_owned(),
        table: "lock_leases".to_owned(),
        lock: "locks/invoice/42".to_owned(),
        ttl_secs: 10.0,
        every: Duration::from_millis(500),
        writes: None,
    };
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--dsn" => parsed.dsn = value()?,
            "--table" => parsed.table = value()?,
            "--lock" => parsed.lock = value()?,
            "--ttl" => parsed.ttl_secs = value()?.parse()?,
            "--every" => parsed.every = Duration::from_millis(value()?.parse()?),
            "--writes" => parsed.writes = Some(value()?.parse()?),
            _ if parsed.gateway_url.is_empty() && !arg.starts_with("--") => {
                parsed.gateway_url = arg
            }
            _ => return Err(format!("unexpected argument {arg:?}; see the module docs").into()),
        }
    }
    let table_ok = !parsed.table.is_empty()
        && parsed
            .table
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '.');
    if !table_ok {
        return Err("--table: lower-case letters, digits, `_` and `.` (schema.table)".into());
    }
    if parsed.every.is_zero() || parsed.ttl_secs <= 0.0 {
        return Err("--ttl and --every must be above zero".into());
    }
    if parsed.gateway_url.is_empty() {
        return Err(
            "usage: pg_lease_worker GATEWAY_URL [--dsn URL] [--table NAME] [--lock KEY] \
                    [--ttl SECONDS] [--every MILLIS] [--writes N]"
                .into(),
        );
    }
    Ok(parsed)
}
