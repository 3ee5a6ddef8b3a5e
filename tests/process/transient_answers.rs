//! Answers that say the provider did nothing (`transient_statuses`, by default 408, 409, 423,
//! 425 and 429) are not outcomes, through the real binary: the client gets the provider's answer
//! with its `Retry-After`, nothing is recorded, and the next attempt with the same key goes to
//! the provider and is charged once. A final refusal (402) is recorded and replayed as before.

use crate::support::provider::Provider;
use crate::support::{send, GatewayProcess};

fn payouts(provider: &Provider, extra: &str) -> String {
    format!(
        "[[routes]]\nname = \"payouts\"\npath = \"/payouts/{{id}}\"\nupstream = \"{}\"\nresource_key = \"payout:{{id}}\"\ntimeout = \"2s\"\n\n[routes.fence]\nmode = \"off\"\n\n[routes.idempotency]\nkey = \"payout:{{id}}\"\n{extra}\n",
        provider.url()
    )
}

#[tokio::test]
async fn a_rate_limited_attempt_is_released_and_the_retry_reaches_the_provider() {
    let provider = Provider::start(true).await;
    let dir = tempfile::tempdir().unwrap();
    let gateway = GatewayProcess::start(dir.path(), &payouts(&provider, ""));
    for (status, id) in [(429, "1"), (409, "2"), (408, "3")] {
        provider.refuse_next(status);
        let url = gateway.url(&format!("/payouts/{id}"));
        let refused = send("POST", &url, &[], "amount=1").await;
        assert_eq!(refused.status.as_u16(), status, "{:?}", refused.body);
        assert_eq!(
            refused.headers.get("retry-after").map(|v| v.as_bytes()),
            Some(&b"2"[..]),
            "{status}: Retry-After passed through"
        );
        let retried = send("POST", &url, &[], "amount=1").await;
        assert_eq!(
            retried.status.as_u16(),
            201,
            "{status}: the retry was answered from a stored {status}: {:?}",
            retried.body
        );
        assert!(retried.headers.get("idempotent-replayed").is_none());
    }
    assert_eq!(provider.calls(), 6);
    let charged: Vec<Option<String>> = provider.charges().into_iter().map(|c| c.key).collect();
    assert_eq!(
        charged,
        [
            Some("payout:1".to_owned()),
            Some("payout:2".to_owned()),
            Some("payout:3".to_owned())
        ]
    );
}

#[tokio::test]
async fn a_final_refusal_is_recorded_and_replayed_and_the_list_can_be_emptied() {
    let provider = Provider::start(true).await;
    let dir = tempfile::tempdir().unwrap();
    let gateway = GatewayProcess::start(dir.path(), &payouts(&provider, "transient_statuses = []"));
    for (status, id) in [(402, "1"), (429, "2")] {
        provider.refuse_next(status);
        let url = gateway.url(&format!("/payouts/{id}"));
        let first = send("POST", &url, &[], "amount=1").await;
        assert_eq!(first.status.as_u16(), status);
        let again = send("POST", &url, &[], "amount=1").await;
        assert_eq!(again.status.as_u16(), status, "{status} replayed");
        assert_eq!(
            again
                .headers
                .get("idempotent-replayed")
                .map(|v| v.as_bytes()),
            Some(&b"true"[..])
        );
    }
    assert_eq!(provider.calls(), 2);
    assert!(provider.charges().is_empty());
}
