//! The foundation: a real wire-protocol server, change streams with resume tokens, and clear
//! connection errors.

mod support;

use std::time::{Duration, Instant};

use counterd::core::event::{ChangeEvent, Operation};
use counterd::store::mongo::{ConnectOptions, MongoStore};
use counterd::store::prelude::*;
use counterd::store::{StreamOptions, StreamStart};
use mongodb::bson::doc;
use support::TestDb;

fn stream_options(start: StreamStart) -> StreamOptions {
    StreamOptions {
        start,
        pre_images: false,
        pipeline: vec![],
        max_await: Duration::from_millis(100),
    }
}

/// Reads until `n` events arrived (or panics after 10 s).
async fn read_events(source: &mut dyn counterd::store::EventSource, n: usize) -> Vec<ChangeEvent> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut out = Vec::new();
    while out.len() < n {
        assert!(
            Instant::now() < deadline,
            "only {} of {n} events arrived",
            out.len()
        );
        let batch = source
            .next_batch(100, Duration::from_millis(50))
            .await
            .unwrap();
        let empty = batch.events.is_empty();
        out.extend(batch.events.into_iter().map(Result::unwrap));
        if empty {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    out
}

#[tokio::test]
async fn change_stream_delivers_inserts_and_resumes_after_a_token() {
    let t = TestDb::new("resume").await;
    let mut source = t
        .store
        .open_stream(stream_options(StreamStart::Now))
        .await
        .unwrap();
    for i in 0..3 {
        t.comments
            .insert_one(doc! {"_id": i, "post_id": "p1"})
            .await
            .unwrap();
    }
    let events = read_events(source.as_mut(), 3).await;
    assert!(events.iter().all(|e| e.operation == Operation::Insert));
    assert!(
        events.windows(2).all(|w| w[0].token < w[1].token),
        "tokens sort in event order"
    );
    let first = events[0].token.clone();
    drop(source);

    t.comments
        .insert_one(doc! {"_id": 3, "post_id": "p1"})
        .await
        .unwrap();
    let mut resumed = t
        .store
        .open_stream(stream_options(StreamStart::After(first.clone())))
        .await
        .unwrap();
    let later = read_events(resumed.as_mut(), 3).await;
    let ids: Vec<_> = later
        .iter()
        .map(|e| e.comment.clone().unwrap().value)
        .collect();
    assert_eq!(
        ids,
        vec![1.into(), 2.into(), 3.into()],
        "only events after the token"
    );
    assert!(later.iter().all(|e| e.token > first));
    // And nothing more is waiting.
    let extra = resumed
        .next_batch(10, Duration::from_millis(50))
        .await
        .unwrap();
    assert!(
        extra.events.is_empty(),
        "no event twice: {:?}",
        extra.events
    );
}

/// The stream is read ahead of the worker (`store::mongo::pump`), so an empty reply can be
/// waiting in its queue when a read begins. The worker takes an empty read for proof that every
/// event before a position it took just before is applied; an empty reply asked for before the
/// read began proves nothing of the sort. Each round leaves such a reply behind (a read cut at
/// its limit, after which the reader asks the server on and finds nothing) before a new event.
#[tokio::test]
async fn an_empty_read_never_answers_with_a_reply_from_before_it() {
    let t = TestDb::new("stale_dry").await;
    let mut source = t
        .store
        .open_stream(stream_options(StreamStart::Now))
        .await
        .unwrap();
    let ids = |read: &counterd::store::RawBatch| -> Vec<mongodb::bson::Bson> {
        read.events
            .iter()
            .map(|e| e.as_ref().unwrap().comment.clone().unwrap().value)
            .collect()
    };
    for round in 0..20 {
        t.comments
            .insert_one(doc! {"_id": round, "post_id": "p1"})
            .await
            .unwrap();
        // Cut at one event: the read does not look at what the reader takes next.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let read = source.next_batch(1, Duration::ZERO).await.unwrap();
            if !read.events.is_empty() {
                assert_eq!(ids(&read), vec![round.into()]);
                break;
            }
            assert!(
                Instant::now() < deadline,
                "round {round}: the insert never arrived"
            );
        }
        // The reader now asks on and finds nothing: that reply is older than what follows.
        t.store.read_position().await.unwrap();
        t.comments
            .insert_one(doc! {"_id": 1000 + round, "post_id": "p1"})
            .await
            .unwrap();
        t.store.read_position().await.unwrap();
        let read = source.next_batch(1, Duration::ZERO).await.unwrap();
        assert_eq!(
            ids(&read),
            vec![(1000 + round).into()],
            "round {round}: a read begun after the insert answered without it"
        );
    }
}

#[tokio::test]
async fn unreachable_server_gives_a_clear_error_within_the_timeout() {
    let port = counterd_testdb::free_port();
    let started = Instant::now();
    let result = MongoStore::connect(&ConnectOptions {
        uri: format!("mongodb://user:hunter2@127.0.0.1:{port}/?directConnection=true"),
        database: "x".into(),
        comments: "comments".into(),
        connect_timeout: Duration::from_millis(800),
        collections: Default::default(),
        schema: Default::default(),
    })
    .await;
    let elapsed = started.elapsed();
    let Err(error) = result else {
        panic!("connected to a closed port")
    };
    let text = error.to_string();
    assert!(error.is_transient(), "{text}");
    assert!(
        text.contains(&format!("127.0.0.1:{port}")),
        "names the host: {text}"
    );
    assert!(
        text.contains("connection refused (is the server running on that host and port?)"),
        "says why, and what to check: {text}"
    );
    assert!(
        !text.contains("hunter2"),
        "never shows the password: {text}"
    );
    assert!(
        elapsed < Duration::from_secs(5),
        "gave up after {elapsed:?}, timeout was 800ms"
    );
}

#[tokio::test]
async fn abilities_are_detected_and_the_fake_is_recognised() {
    let t = TestDb::new("abilities").await;
    let a = &t.abilities;
    assert!(
        a.wire_version >= 9,
        "driver needs wire 9+, got {}",
        a.wire_version
    );
    if support::server().kind == counterd_testdb::ServerKind::Fake {
        assert!(!a.hello, "the fake answers isMaster only");
        assert!(!a.sessions && !a.pre_images && !a.snapshot_reads);
    }
}
