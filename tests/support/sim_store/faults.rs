//! Injected faults and the interleaving points of every store call: the wrapper's three ways
//! into the in-process store (a read or single-document call, a multi-statement write).

use counterd::store::{StoreError, StoreResult};
use rand::Rng;

use super::{SimStore, State};

/// The message of every injected fault, so the simulation can tell them from real errors.
pub const INJECTED: &str = "sim: injected";

/// How often store calls fail and yield.
#[derive(Clone, Debug)]
pub struct Faults {
    /// Probability that a call fails by an injected fault.
    pub rate: f64,
    /// Share of injected faults that are transient (the worker retries in-process) rather than
    /// fatal (the worker stops and is restarted).
    pub transient_share: f64,
    /// Probability that a call yields to the other actors first.
    pub yield_rate: f64,
    /// Faults left in this round (a cap, so that every round ends).
    pub budget: u32,
}

impl Faults {
    pub fn none() -> Faults {
        Faults {
            rate: 0.0,
            transient_share: 0.0,
            yield_rate: 0.0,
            budget: 0,
        }
    }
}

/// Where an injected fault strikes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Strike {
    /// Before the call did anything.
    Before,
    /// A multi-statement write (`ordered: false`) in which only the statements marked `true`
    /// landed before the error: any subset, not only a prefix.
    Partial(Vec<bool>),
    /// After the call did everything (the reply was lost).
    After,
}

impl State {
    /// Decides whether this call fails, and where.
    fn strike(
        &mut self,
        op: &'static str,
        statements: Option<usize>,
        writes: bool,
    ) -> Option<(Strike, StoreError)> {
        if self.faults.budget == 0
            || self.faults.rate <= 0.0
            || !self.rng.random_bool(self.faults.rate.min(1.0))
        {
            return None;
        }
        self.faults.budget -= 1;
        let strike = match (writes, statements) {
            (false, _) => Strike::Before,
            (true, Some(n)) if n > 1 => match self.rng.random_range(0..3) {
                0 => Strike::Before,
                1 => {
                    // Some statements landed, at least one did not.
                    let missed = self.rng.random_range(0..n);
                    let landed = (0..n)
                        .map(|i| i != missed && self.rng.random_bool(0.5))
                        .collect();
                    Strike::Partial(landed)
                }
                _ => Strike::After,
            },
            (true, _) => {
                if self.rng.random_bool(0.5) {
                    Strike::Before
                } else {
                    Strike::After
                }
            }
        };
        // A transient fault makes the worker back off on the simulated clock (it only yields).
        let transient = self.rng.random_bool(self.faults.transient_share);
        let kind = if transient { "transient" } else { "fatal" };
        let at = match strike {
            Strike::Before => "before",
            Strike::Partial(_) => "partial",
            Strike::After => "after",
        };
        self.stat(format!("fault {op} {at}"));
        self.stat(format!("fault {kind}"));
        if !self.memory.carried.is_empty() {
            self.stat("fault while counters are carried");
        }
        self.note(format!("  !! {kind} fault in {op} ({at})"));
        let message = format!("{INJECTED} {kind} fault ({at})");
        let error = if transient {
            StoreError::Transient { op, message }
        } else {
            StoreError::Fatal { op, message }
        };
        Some((strike, error))
    }
}

impl SimStore {
    /// The entry of a store call: maybe yield, then maybe strike.
    pub(super) async fn enter(
        &self,
        op: &'static str,
        statements: Option<usize>,
        writes: bool,
    ) -> Option<(Strike, StoreError)> {
        self.maybe_yield().await;
        let mut s = self.lock();
        s.probe_point();
        if writes {
            s.generation += 1;
        }
        s.stat(format!("call {op}"));
        s.strike(op, statements, writes)
    }

    /// A read or single-document call: fails before or after `body`.
    pub(super) async fn single<T>(
        &self,
        op: &'static str,
        writes: bool,
        body: impl FnOnce(&mut State) -> StoreResult<T>,
    ) -> StoreResult<T> {
        let strike = self.enter(op, None, writes).await;
        if let Some((Strike::Before, e)) = strike {
            return Err(e);
        }
        let mut s = self.lock();
        let result = body(&mut s)?;
        match strike {
            Some((_, e)) => Err(e),
            None => Ok(result),
        }
    }

    /// A multi-statement write (`ordered: false`): the in-process store's statements apply one
    /// by one, the other actors may run between them, and a fault may leave any subset of them
    /// applied.
    pub(super) async fn statements<T>(
        &self,
        op: &'static str,
        items: &[T],
        mut body: impl FnMut(&mut State, &T),
    ) -> StoreResult<()> {
        let strike = self.enter(op, Some(items.len()), true).await;
        let lands = |i: usize| match &strike {
            Some((Strike::Before, _)) => false,
            Some((Strike::Partial(landed), _)) => landed[i],
            _ => true,
        };
        for (i, item) in items.iter().enumerate().filter(|(i, _)| lands(*i)) {
            if i > 0 {
                self.maybe_yield().await;
            }
            body(&mut self.lock(), item);
        }
        match strike {
            Some((_, e)) => Err(e),
            None => Ok(()),
        }
    }
}

/// Whether a drained stream answers "nothing new" now, while other actors run.
pub(super) fn drained_answer(s: &mut State) -> bool {
    let rate = s.drained_answers;
    s.rng.random_bool(rate)
}
