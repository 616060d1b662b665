//! Phase X, the outage backlog: what an outage really leaves behind is not only inserts. 80 %
//! inserts, the rest soft deletes, undeletes, moves between posts and hard deletes of older
//! rows, on Zipf posts with 2 KB bodies, written while counterd is stopped; then the real
//! `counterd run` catches up. Set against an inserts-only backlog of the same size and bodies
//! caught up by the same binary in the same run (the ratio is the figure: it holds on a loaded
//! machine), with a bare change-stream reader over the mixed backlog with and without
//! `updateLookup` (the server's floor), and where the worker waited, by concern (the sums of
//! `counterd_mongodb_operation_duration_seconds` per operation). The counters are checked
//! exact against the backlog's known final state.

use std::collections::HashMap;
use std::path::Path;
use std::time::Instant;

use anyhow::{anyhow, bail};
use bson::{doc, Bson, DateTime, Document, Timestamp};
use futures::TryStreamExt;
use mongodb::options::FullDocumentType;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Zipf};
use serde::Serialize;

use crate::harness::{comments, just_before_now, Bench, Counted};
use crate::measure::median;
use crate::phases::rss::CounterdChild;
use crate::plan::{Plan, TARGET_FLAT_RSS_MB, ZIPF_EXPONENT};
use crate::report::{Row, Status};
use crate::{say, Collected};

/// The mix's rate against the inserts-only rate of the same run (issue #41).
pub const TARGET_MIXED_VS_INSERTS: f64 = 0.6;
/// The 60 000-event outage caught up in under half of the 62.6 s measured before issue #41.
pub const TARGET_OUTAGE_SECS: f64 = 62.6 / 2.0;
/// The outage: events, posts.
const FULL: (usize, usize) = (60_000, 5_000);
const QUICK: (usize, usize) = (3_000, 500);
const BODY_BYTES: usize = 2048;
/// Events per round: its inserts first, then its changes to rows of earlier rounds.
const ROUND: usize = 1_000;

/// A change to an older row.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Change {
    SoftDelete(i64),
    Undelete(i64),
    Move(i64, i64),
    HardDelete(i64),
}

/// One round of the backlog, written as one insert command, one ordered update command and one
/// delete command (a row deleted in a round is changed by no later event of it).
#[derive(Debug, Default)]
struct Round {
    inserts: Vec<(i64, i64)>,
    updates: Vec<Change>,
    deletes: Vec<i64>,
}

/// Ids to draw from at random and remove in O(1).
#[derive(Default)]
struct Pool {
    ids: Vec<i64>,
    at: HashMap<i64, usize>,
}

impl Pool {
    fn add(&mut self, id: i64) {
        self.at.insert(id, self.ids.len());
        self.ids.push(id);
    }
    fn remove(&mut self, id: i64) {
        if let Some(i) = self.at.remove(&id) {
            self.ids.swap_remove(i);
            if let Some(moved) = self.ids.get(i) {
                self.at.insert(*moved, i);
            }
        }
    }
    fn pick(&self, rng: &mut StdRng) -> Option<i64> {
        (!self.ids.is_empty()).then(|| self.ids[rng.random_range(0..self.ids.len())])
    }
}

/// The backlog: its rounds, and the live comments per post it leaves.
#[derive(Debug, Default, Serialize)]
pub struct Mix {
    #[serde(skip)]
    rounds: Vec<Round>,
    #[serde(skip)]
    expected: HashMap<i64, i64>,
    pub events: usize,
    pub inserts: usize,
    pub soft_deletes: usize,
    pub undeletes: usize,
    pub moves: usize,
    pub hard_deletes: usize,
}

/// Draws the outage backlog: `events` events on `posts` Zipf posts; with `inserts_only`, the
/// same number of inserts alone.
fn draw_mix(events: usize, posts: usize, seed: u64, inserts_only: bool) -> anyhow::Result<Mix> {
    let mut rng = StdRng::seed_from_u64(seed);
    let zipf = Zipf::new(posts as f64, ZIPF_EXPONENT).map_err(|e| anyhow!("zipf: {e}"))?;
    // id -> (post, soft-deleted)
    let mut rows: HashMap<i64, (i64, bool)> = HashMap::new();
    let (mut live, mut deleted, mut older) = (Pool::default(), Pool::default(), Pool::default());
    let mut mix = Mix::default();
    let mut next_id = 0_i64;
    while mix.events < events {
        let mut round = Round::default();
        let mut drawn = 0;
        while drawn < ROUND && mix.events < events {
            let roll: f64 = rng.random();
            let change = if inserts_only || roll < 0.8 {
                None
            } else if roll < 0.90 {
                // Soft deletes 6 %, undeletes 4 % (a soft delete while none is deleted).
                match deleted.pick(&mut rng).filter(|_| roll >= 0.86) {
                    Some(id) => Some(Change::Undelete(id)),
                    None => live.pick(&mut rng).map(Change::SoftDelete),
                }
            } else if roll < 0.95 {
                // To another post: a `$set` of the same value changes nothing, and the server
                // writes no event for it.
                let to = zipf.sample(&mut rng) as i64;
                older.pick(&mut rng).map(|id| {
                    Change::Move(
                        id,
                        if rows[&id].0 == to {
                            to % posts as i64 + 1
                        } else {
                            to
                        },
                    )
                })
            } else {
                older.pick(&mut rng).map(Change::HardDelete)
            };
            drawn += 1;
            mix.events += 1;
            let Some(change) = change else {
                let post = zipf.sample(&mut rng) as i64;
                rows.insert(next_id, (post, false));
                round.inserts.push((next_id, post));
                mix.inserts += 1;
                next_id += 1;
                continue;
            };
            match change {
                Change::SoftDelete(id) => {
                    rows.get_mut(&id).expect("drawn").1 = true;
                    mix.soft_deletes += 1;
                    live.remove(id);
                    deleted.add(id);
                }
                Change::Undelete(id) => {
                    rows.get_mut(&id).expect("drawn").1 = false;
                    mix.undeletes += 1;
                    deleted.remove(id);
                    live.add(id);
                }
                Change::Move(id, to) => {
                    rows.get_mut(&id).expect("drawn").0 = to;
                    mix.moves += 1;
                }
                Change::HardDelete(id) => {
                    rows.remove(&id);
                    mix.hard_deletes += 1;
                    for pool in [&mut live, &mut deleted, &mut older] {
                        pool.remove(id);
                    }
                    round.deletes.push(id);
                    continue;
                }
            }
            round.updates.push(change);
        }
        // This round's rows are older rows from the next round on.
        for (id, _) in &round.inserts {
            live.add(*id);
            older.add(*id);
        }
        mix.rounds.push(round);
    }
    for (post, deleted) in rows.values() {
        if !deleted {
            *mix.expected.entry(*post).or_default() += 1;
        }
    }
    Ok(mix)
}

/// Writes the backlog; returns the seconds taken.
async fn write_mix(store: &Counted, mix: &Mix) -> anyhow::Result<f64> {
    let started = Instant::now();
    let db = store.inner().database();
    let body = "b".repeat(BODY_BYTES);
    let created = DateTime::now();
    for round in &mix.rounds {
        if !round.inserts.is_empty() {
            let docs: Vec<Document> = round
                .inserts
                .iter()
                .map(|(id, post)| doc! {"_id": id, "post_id": post, "created_at": created, "body": body.as_str()})
                .collect();
            comments(store).insert_many(docs).await?;
        }
        if !round.updates.is_empty() {
            let now = DateTime::now();
            let updates: Vec<Document> = round
                .updates
                .iter()
                .map(|c| match *c {
                    Change::SoftDelete(id) => {
                        doc! {"q": {"_id": id}, "u": {"$set": {"deleted_at": now}}}
                    }
                    Change::Undelete(id) => {
                        doc! {"q": {"_id": id}, "u": {"$unset": {"deleted_at": ""}}}
                    }
                    Change::Move(id, to) => doc! {"q": {"_id": id}, "u": {"$set": {"post_id": to}}},
                    Change::HardDelete(_) => unreachable!("deletes are written apart"),
                })
                .collect();
            db.run_command(doc! {"update": "comments", "updates": updates, "ordered": true})
                .await?;
        }
        if !round.deletes.is_empty() {
            let deletes: Vec<Document> = round
                .deletes
                .iter()
                .map(|id| doc! {"q": {"_id": id}, "limit": 1})
                .collect();
            db.run_command(doc! {"delete": "comments", "deletes": deletes, "ordered": true})
                .await?;
        }
    }
    Ok(started.elapsed().as_secs_f64())
}

/// Reads `n` events of the stream from `start` with a bare reader (counterd's projection and
/// reply size), with or without `updateLookup`; returns the seconds taken.
async fn bare_read(
    store: &Counted,
    start: Timestamp,
    n: usize,
    lookup: bool,
) -> anyhow::Result<f64> {
    let started = Instant::now();
    let projection = counterd::core::schema::Schema::default().stream_projection();
    let comments = comments(store);
    let mut watch = comments
        .watch()
        .pipeline(vec![projection])
        .start_at_operation_time(start)
        .batch_size(counterd::core::cost::EVENTS_PER_REPLY);
    if lookup {
        watch = watch.full_document(FullDocumentType::UpdateLookup);
    }
    let mut stream = watch.await?.with_type::<bson::RawDocumentBuf>();
    let mut seen = 0;
    while seen < n {
        if stream.try_next().await?.is_some() {
            seen += 1;
        }
        if started.elapsed().as_secs() > 600 {
            bail!("the bare reader saw {seen} of {n} events in 10 minutes");
        }
    }
    Ok(started.elapsed().as_secs_f64())
}

/// One catch-up of `counterd run`.
#[derive(Debug, Serialize)]
pub struct CatchUp {
    pub events: usize,
    pub load_secs: f64,
    pub catch_up_secs: f64,
    pub events_per_sec: f64,
    pub peak_rss_mb: Option<f64>,
    pub cpu_us_per_event: Option<f64>,
    /// The counters equal the backlog's final state once caught up.
    pub exact: bool,
    /// Seconds spent in each store operation (summed over concurrent calls) and its calls.
    pub waits: Vec<(String, f64, u64)>,
    /// Counts made by the reconciler, and those of posts the worker had not reached.
    pub recounts: f64,
    pub recounts_in_flight: f64,
}

/// Loads `mix` into a fresh database and times `counterd run` catching it up.
async fn catch_up(bench: &Bench, binary: &Path, mix: &Mix, phase: &str) -> anyhow::Result<CatchUp> {
    let store = bench.store(phase).await?;
    let start = just_before_now();
    // The index the doctor asks for (recounts read by post); the fake server keeps it but
    // plans no query with it.
    comments(&store)
        .create_index(
            mongodb::IndexModel::builder()
                .keys(doc! {"post_id": 1, "created_at": 1})
                .build(),
        )
        .await?;
    // counterd ran before the outage: its checkpoint stands before the backlog, and the rows
    // the backlog changes are the ones its ledger learnt of from their inserts (no initial
    // snapshot of rows it never saw).
    let before = CounterdChild::start(bench, binary, start, phase, &[]).await?;
    wait_checkpointed(&store).await?;
    before.stop().await;
    say!(
        "mixed: counterd stopped; writing {} events ({phase}) ...",
        mix.events
    );
    let load_secs = write_mix(&store, mix).await?;
    let started = Instant::now();
    let mut child = CounterdChild::start(bench, binary, start, phase, &[]).await?;
    child.wait_applied(mix.events).await?;
    let catch_up_secs = started.elapsed().as_secs_f64();
    let cpu = child.cpu();
    let exact = wait_exact(&store, &mix.expected).await?;
    let metrics = child.metrics().await.unwrap_or_default();
    let peak_rss_mb = child.peak_rss_mb();
    child.stop().await;
    bench.drop_db(&store).await;
    let run = CatchUp {
        events: mix.events,
        load_secs,
        catch_up_secs,
        events_per_sec: mix.events as f64 / catch_up_secs,
        peak_rss_mb,
        cpu_us_per_event: cpu.map(|c| c.as_secs_f64() * 1e6 / mix.events as f64),
        exact,
        waits: waits(&metrics),
        recounts: metric_sum(&metrics, "counterd_recounts_total"),
        recounts_in_flight: metric_sum(&metrics, "counterd_recounts_in_flight_total"),
    };
    say!(
        "mixed: {phase}: {} events caught up in {catch_up_secs:.1} s ({:.0} events/s), peak RSS {:?} MB, exact: {exact}",
        mix.events,
        run.events_per_sec,
        peak_rss_mb
    );
    for (op, secs, calls) in run.waits.iter().take(6) {
        say!("mixed: {phase}:   {secs:>7.2} s in {calls:>6} calls: {op}");
    }
    Ok(run)
}

/// Waits until a stream's checkpoint is stored (a first `counterd run` has started its stream).
async fn wait_checkpointed(store: &Counted) -> anyhow::Result<()> {
    let db = store.inner().database();
    let deadline = Instant::now() + std::time::Duration::from_secs(60);
    loop {
        for name in db.list_collection_names().await? {
            if name.ends_with("checkpoints")
                && db
                    .collection::<Document>(&name)
                    .count_documents(doc! {})
                    .await?
                    > 0
            {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            bail!("`counterd run` stored no checkpoint within 60 s");
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// Polls the counters until they equal `expected` (30 s at most); whether they did.
async fn wait_exact(store: &Counted, expected: &HashMap<i64, i64>) -> anyhow::Result<bool> {
    let counters = store
        .inner()
        .database()
        .collection::<Document>("comment_counters");
    let deadline = Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let docs: Vec<Document> = counters.find(doc! {}).await?.try_collect().await?;
        let mut seen: HashMap<i64, i64> = HashMap::new();
        for d in &docs {
            let id = d.get("_id").and_then(Bson::as_i64_lossy);
            let count = d.get("count").and_then(Bson::as_i64_lossy).unwrap_or(0);
            if let Some(id) = id {
                seen.insert(id, count);
            }
        }
        let differs = expected
            .iter()
            .filter(|(p, n)| seen.get(p).copied().unwrap_or(0) != **n)
            .count()
            + seen
                .iter()
                .filter(|(p, n)| **n != 0 && !expected.contains_key(p))
                .count();
        if differs == 0 {
            return Ok(true);
        }
        if Instant::now() > deadline {
            say!("mixed: {differs} counters differ from the backlog's final state after 30 s");
            return Ok(false);
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

trait Lossy {
    fn as_i64_lossy(&self) -> Option<i64>;
}

impl Lossy for Bson {
    fn as_i64_lossy(&self) -> Option<i64> {
        match self {
            Bson::Int32(v) => Some(*v as i64),
            Bson::Int64(v) => Some(*v),
            Bson::Double(v) => Some(*v as i64),
            _ => None,
        }
    }
}

/// `(op, seconds, calls)` of `counterd_mongodb_operation_duration_seconds`, most seconds first.
fn waits(metrics: &str) -> Vec<(String, f64, u64)> {
    let mut by_op: HashMap<String, (f64, u64)> = HashMap::new();
    for line in metrics.lines() {
        let (name, value) = match line.rsplit_once(' ') {
            Some(parts) => parts,
            None => continue,
        };
        let sum = name.starts_with("counterd_mongodb_operation_duration_seconds_sum{");
        let count = name.starts_with("counterd_mongodb_operation_duration_seconds_count{");
        if !sum && !count {
            continue;
        }
        let Some(op) = name.split("op=\"").nth(1).and_then(|r| r.split('"').next()) else {
            continue;
        };
        let entry = by_op.entry(op.to_string()).or_default();
        let v: f64 = value.parse().unwrap_or(0.0);
        if sum {
            entry.0 += v;
        } else {
            entry.1 += v as u64;
        }
    }
    let mut out: Vec<_> = by_op.into_iter().map(|(op, (s, c))| (op, s, c)).collect();
    out.sort_by(|a, b| b.1.total_cmp(&a.1));
    out
}

/// The sum of a counter's series in a metrics text (0 when absent).
fn metric_sum(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// The phase's figures.
#[derive(Debug, Serialize)]
pub struct Mixed {
    pub mix: Mix,
    pub posts: usize,
    pub body_bytes: usize,
    pub bare_with_lookup_secs: f64,
    pub bare_without_lookup_secs: f64,
    /// Mixed ÷ inserts-only events/s of every pair of runs (`--mixed-runs`); the pair of the
    /// median is `mixed` and `inserts_only`.
    pub ratios: Vec<f64>,
    pub mixed: CatchUp,
    pub inserts_only: CatchUp,
}

/// The outage backlog and the inserts-only one, caught up by `counterd run`.
pub async fn mixed_phase(bench: &Bench, plan: &Plan, out: &mut Collected) -> anyhow::Result<()> {
    let exe = std::env::current_exe()?;
    let binary = exe.with_file_name("counterd");
    if !binary.is_file() {
        say!(
            "mixed: skipped: the phase runs `counterd run`, and {} is not built (cargo build --release -p counterd)",
            binary.display()
        );
        return Ok(());
    }
    let (events, posts) = if plan.mode == "quick" { QUICK } else { FULL };
    let mix = draw_mix(events, posts, 41, false)?;
    let inserts = draw_mix(events, posts, 41, true)?;
    say!(
        "mixed: {} events: {} inserts, {} soft deletes, {} undeletes, {} moves, {} hard deletes",
        mix.events,
        mix.inserts,
        mix.soft_deletes,
        mix.undeletes,
        mix.moves,
        mix.hard_deletes
    );
    // The floor: the same backlog read bare, with the server's lookups and without.
    let (with_lookup, without_lookup) = {
        let store = bench.store("mixbare").await?;
        let start = just_before_now();
        write_mix(&store, &mix).await?;
        let mut with = Vec::new();
        let mut without = Vec::new();
        for _ in 0..2 {
            without.push(bare_read(&store, start, mix.events, false).await?);
            with.push(bare_read(&store, start, mix.events, true).await?);
        }
        bench.drop_db(&store).await;
        (median(&with), median(&without))
    };
    say!("mixed: bare reader: {with_lookup:.2} s with updateLookup, {without_lookup:.2} s without");
    // Alternating, inserts-only first: a machine that slows down meanwhile slows both.
    let mut runs = Vec::new();
    for _ in 0..plan.mixed_runs.max(1) {
        let inserts_only = catch_up(bench, &binary, &inserts, "mixins").await?;
        let mixed = catch_up(bench, &binary, &mix, "mixed").await?;
        runs.push((mixed, inserts_only));
    }
    let ratios: Vec<f64> = runs
        .iter()
        .map(|(m, i)| m.events_per_sec / i.events_per_sec)
        .collect();
    say!("mixed: mixed ÷ inserts-only per run: {ratios:.3?}");
    // The run of the median ratio is the one reported.
    let ratio = median(&ratios);
    let at = ratios.iter().position(|r| *r == ratio).unwrap_or(0);
    let (mixed, inserts_only) = runs.swap_remove(at);
    let figures = Mixed {
        mix,
        posts,
        body_bytes: BODY_BYTES,
        bare_with_lookup_secs: with_lookup,
        bare_without_lookup_secs: without_lookup,
        ratios,
        mixed,
        inserts_only,
    };
    rows(&figures, out);
    out.phase("mixed", &figures)?;
    Ok(())
}

fn rows(f: &Mixed, out: &mut Collected) {
    let (m, i) = (&f.mixed, &f.inserts_only);
    let ratio = m.events_per_sec / i.events_per_sec;
    out.rows.push(
        Row::info(
            "mixed_rate",
            "X. outage backlog (80 % inserts, rest changes to older rows), `counterd run` catch-up",
            m.events_per_sec,
            "events/s",
        )
        .against(i.events_per_sec, "inserts-only backlog, same size, same run")
        .target(
            &format!(">= {TARGET_MIXED_VS_INSERTS} x inserts-only"),
            Status::of(ratio >= TARGET_MIXED_VS_INSERTS),
        )
        .note(format!(
            "{} events on {} posts, {} B bodies; median of {} alternating pairs (ratios {:.3?}); bare reader {:.2} s with updateLookup, {:.2} s without",
            m.events, f.posts, f.body_bytes, f.ratios.len(), f.ratios, f.bare_with_lookup_secs, f.bare_without_lookup_secs
        )),
    );
    let full = m.events == FULL.0;
    out.rows.push(
        Row::info(
            "mixed_outage_secs",
            "X. outage backlog caught up",
            m.catch_up_secs,
            "s",
        )
        .target(
            &format!("< {TARGET_OUTAGE_SECS:.1} s (60 000 events)"),
            if full {
                Status::of(m.catch_up_secs < TARGET_OUTAGE_SECS)
            } else {
                Status::NotJudged
            },
        )
        .note(format!(
            "exact: {}; recounts {:.0}, of posts the worker had not reached {:.0}",
            m.exact, m.recounts, m.recounts_in_flight
        )),
    );
    let peak = m.peak_rss_mb.unwrap_or(f64::NAN);
    out.rows.push(
        Row::info(
            "mixed_rss",
            "X. `counterd run` peak RSS, outage backlog",
            peak,
            "MB",
        )
        .target(
            &format!("<= {TARGET_FLAT_RSS_MB:.0} MB"),
            Status::of(peak <= TARGET_FLAT_RSS_MB),
        ),
    );
    out.rows.push(
        Row::info(
            "mixed_exact",
            "X. counters exact after the outage backlog",
            f64::from(u8::from(m.exact && i.exact)),
            "bool",
        )
        .target("1", Status::of(m.exact && i.exact)),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mix_is_mostly_inserts_and_every_kind_occurs() {
        let mix = draw_mix(10_000, 500, 41, false).unwrap();
        assert_eq!(mix.events, 10_000);
        let changes = mix.events - mix.inserts;
        assert!((1_500..2_500).contains(&changes), "{mix:?}");
        for n in [mix.soft_deletes, mix.undeletes, mix.moves, mix.hard_deletes] {
            assert!(n > 100, "{mix:?}");
        }
        assert_eq!(
            replay(&mix),
            mix.expected,
            "the expected counts follow the events"
        );
        let inserts = draw_mix(10_000, 500, 41, true).unwrap();
        assert_eq!(inserts.inserts, 10_000);
    }

    /// The live rows per post the rounds leave, written as `write_mix` writes them.
    fn replay(mix: &Mix) -> HashMap<i64, i64> {
        let mut rows: HashMap<i64, (i64, bool)> = HashMap::new();
        for round in &mix.rounds {
            for (id, post) in &round.inserts {
                assert!(rows.insert(*id, (*post, false)).is_none());
            }
            for c in &round.updates {
                match c {
                    Change::SoftDelete(id) => rows.get_mut(id).expect("a row").1 = true,
                    Change::Undelete(id) => rows.get_mut(id).expect("a row").1 = false,
                    Change::Move(id, to) => {
                        let row = rows.get_mut(id).expect("a row");
                        assert_ne!(row.0, *to, "a move changes the post (else no event)");
                        row.0 = *to;
                    }
                    Change::HardDelete(_) => unreachable!(),
                };
            }
            for id in &round.deletes {
                assert!(rows.remove(id).is_some(), "an existing row");
            }
        }
        let mut live = HashMap::new();
        for (post, deleted) in rows.values() {
            if !deleted {
                *live.entry(*post).or_default() += 1;
            }
        }
        live
    }
}
