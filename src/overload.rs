//! Overload on memory: what rota stops doing when its resident set nears a configured limit.
//!
//! Every class of memory held for outside parties has a budget of its own ([`crate::budget`],
//! the unread answers, the stream caps), but their sum, the allocator's slack and rota's own
//! tables can still reach what the machine or container allows. With `server.max_rss_bytes`
//! set, a sampler reads the process's resident set every [`SAMPLE_EVERY`] and moves between
//! three levels, as an overload manager does with its actions:
//!
//! - **normal**;
//! - **refusing** from [`REFUSE_AT`] of the limit: new `Watch` and xDS streams, the streams that
//!   hold a copy of what they follow, are refused with `RESOURCE_EXHAUSTED`;
//! - **shedding** from [`SHED_AT`]: the open ones end too, with the same status, so their
//!   clients reconnect elsewhere or later.
//!
//! Picks, reports and registrations are never refused for memory: they are what rota is for,
//! and they hold nothing that grows with a client. A level is left only some way below where
//! it was entered ([`RELIEF`]), so a resident set hovering at a threshold does not flap.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::watch;

/// Time between two readings of the resident set.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(250);
/// Share of the limit, in thousandths, from which new holding streams are refused.
pub const REFUSE_AT: u64 = 900;
/// Share of the limit, in thousandths, from which open holding streams end.
pub const SHED_AT: u64 = 980;
/// How far below its threshold, in thousandths of the limit, a level is left.
pub const RELIEF: u64 = 50;

/// How close rota is to its memory limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Pressure {
    Normal,
    /// New holding streams are refused.
    Refusing,
    /// Open holding streams end as well.
    Shedding,
}

impl Pressure {
    pub fn as_str(self) -> &'static str {
        match self {
            Pressure::Normal => "normal",
            Pressure::Refusing => "refusing",
            Pressure::Shedding => "shedding",
        }
    }
}

/// A stream refused, or ended, because rota is near its memory limit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "rota holds {rss} bytes resident, {share}% of its limit of {limit} (server.max_rss_bytes): Watch and xDS streams are refused until it falls below {below} bytes; picks go on"
)]
pub struct Overloaded {
    pub rss: u64,
    pub limit: u64,
    pub share: u64,
    pub below: u64,
}

/// The process's memory pressure, as last sampled. Without a limit it stays normal.
#[derive(Debug)]
pub struct Overload {
    limit: Option<u64>,
    rss: AtomicU64,
    pressure: watch::Sender<Pressure>,
    refused: AtomicU64,
    shed: AtomicU64,
}

impl Overload {
    /// `limit` bytes resident; `None` turns the levels off (the resident set is still sampled
    /// for the metrics if the sampler runs).
    pub fn new(limit: Option<u64>) -> Self {
        Self {
            limit: limit.filter(|&limit| limit > 0),
            rss: AtomicU64::new(0),
            pressure: watch::Sender::new(Pressure::Normal),
            refused: AtomicU64::new(0),
            shed: AtomicU64::new(0),
        }
    }

    pub fn limit(&self) -> Option<u64> {
        self.limit
    }

    /// The resident set at the last sample (0 before the first).
    pub fn rss(&self) -> u64 {
        self.rss.load(Ordering::Relaxed)
    }

    pub fn pressure(&self) -> Pressure {
        *self.pressure.borrow()
    }

    /// Streams refused, and streams ended, for memory so far.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    pub fn shed(&self) -> u64 {
        self.shed.load(Ordering::Relaxed)
    }

    /// Returns once the pressure is `level` (at once if it is).
    pub async fn reached(&self, level: Pressure) {
        let _ = self.pressure.subscribe().wait_for(|&now| now == level).await;
    }

    /// Takes a reading of the resident set and moves to the level it calls for.
    pub fn observe(&self, rss: u64) {
        self.rss.store(rss, Ordering::Relaxed);
        let Some(limit) = self.limit else { return };
        let share = thousandths(rss, limit);
        let now = self.pressure();
        let next = if share >= SHED_AT {
            Pressure::Shedding
        } else if share >= REFUSE_AT {
            match now {
                Pressure::Shedding if share >= SHED_AT - RELIEF => Pressure::Shedding,
                _ => Pressure::Refusing,
            }
        } else if now != Pressure::Normal && share >= REFUSE_AT - RELIEF {
            // Still near enough: a refusing level stays; a shedding one eases to refusing.
            Pressure::Refusing
        } else {
            Pressure::Normal
        };
        if next != now {
            tracing::warn!(rss, limit, from = now.as_str(), to = next.as_str(), "memory pressure changed");
            self.pressure.send_replace(next);
        }
    }

    /// Lets a holding stream open, or says why not (and counts it).
    pub fn admit(&self) -> Result<(), Overloaded> {
        match self.overloaded() {
            None => Ok(()),
            Some(refused) => {
                self.refused.fetch_add(1, Ordering::Relaxed);
                Err(refused)
            }
        }
    }

    /// Returns when open holding streams should end (and counts the one that asked), with
    /// the reason to give its client. Pending forever without a limit.
    pub async fn shedding(&self) -> Overloaded {
        let mut pressure = self.pressure.subscribe();
        // `wait_for` fails only when the sender is gone, and `self` holds it.
        let _ = pressure.wait_for(|&level| level == Pressure::Shedding).await;
        self.shed.fetch_add(1, Ordering::Relaxed);
        self.overloaded().unwrap_or_else(|| self.reason(self.limit.unwrap_or(0)))
    }

    fn overloaded(&self) -> Option<Overloaded> {
        let limit = self.limit?;
        (self.pressure() != Pressure::Normal).then(|| self.reason(limit))
    }

    fn reason(&self, limit: u64) -> Overloaded {
        let rss = self.rss();
        Overloaded {
            rss,
            limit,
            share: thousandths(rss, limit) / 10,
            below: (u128::from(limit) * u128::from(REFUSE_AT - RELIEF) / 1000) as u64,
        }
    }
}

fn thousandths(part: u64, whole: u64) -> u64 {
    (u128::from(part) * 1000 / u128::from(whole.max(1))).min(u128::from(u64::MAX)) as u64
}

/// Where the resident set is read: the process's own, or a figure someone else keeps (an
/// embedding host, or a test that sets the pressure it needs).
#[derive(Clone, Default)]
pub enum ResidentSet {
    #[default]
    Process,
    Given(Arc<AtomicU64>),
}

impl std::fmt::Debug for ResidentSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ResidentSet::Process => f.write_str("Process"),
            ResidentSet::Given(bytes) => write!(f, "Given({})", bytes.load(Ordering::Relaxed)),
        }
    }
}

impl ResidentSet {
    /// Takes one reading into `overload` (the process's off the runtime's threads: `/proc` is a
    /// file system).
    pub async fn sample(&self, overload: &Overload) {
        let rss = match self {
            ResidentSet::Given(bytes) => Some(bytes.load(Ordering::Relaxed)),
            ResidentSet::Process => match tokio::task::spawn_blocking(resident_bytes).await {
                Ok(rss) => rss,
                Err(_) => {
                    tracing::error!("resident set reading failed");
                    return;
                }
            },
        };
        match rss {
            Some(rss) => overload.observe(rss),
            None => tracing::debug!("resident set unreadable"),
        }
    }

    /// Samples for good, the first reading after [`SAMPLE_EVERY`].
    pub async fn run_sampler(self, overload: Arc<Overload>) {
        let mut ticker = tokio::time::interval(SAMPLE_EVERY);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await;
        loop {
            ticker.tick().await;
            self.sample(&overload).await;
        }
    }
}

/// The process's resident set in bytes, from `/proc/self/statm` (pages; Linux only).
pub fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * page_size())
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions; it returns -1 for an unknown name, not UB.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(size).ok().filter(|&size| size > 0).unwrap_or(4096)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn at(overload: &Overload, permille: u64) -> Pressure {
        overload.observe(overload.limit().unwrap() * permille / 1000);
        overload.pressure()
    }

    #[test]
    fn levels_follow_the_share_of_the_limit_and_leave_below_where_they_were_entered() {
        let overload = Overload::new(Some(1000 * MIB));
        assert_eq!(at(&overload, 899), Pressure::Normal);
        assert_eq!(at(&overload, 900), Pressure::Refusing);
        // Left only below 85 %.
        assert_eq!(at(&overload, 860), Pressure::Refusing);
        assert_eq!(at(&overload, 849), Pressure::Normal);
        assert_eq!(at(&overload, 980), Pressure::Shedding);
        // Shedding eases to refusing below 93 %, and to normal below 85 %.
        assert_eq!(at(&overload, 940), Pressure::Shedding);
        assert_eq!(at(&overload, 929), Pressure::Refusing);
        assert_eq!(at(&overload, 979), Pressure::Refusing);
        assert_eq!(at(&overload, 100), Pressure::Normal);
        // From normal straight to shedding.
        assert_eq!(at(&overload, 2000), Pressure::Shedding);
    }

    #[test]
    fn without_a_limit_nothing_is_refused() {
        let overload = Overload::new(None);
        overload.observe(u64::MAX);
        assert_eq!(overload.pressure(), Pressure::Normal);
        assert_eq!(overload.admit(), Ok(()));
        assert_eq!(Overload::new(Some(0)).limit(), None);
    }

    #[test]
    fn a_refusal_names_the_setting_the_figures_and_where_it_ends() {
        let overload = Overload::new(Some(1000 * MIB));
        assert_eq!(overload.admit(), Ok(()));
        overload.observe(950 * MIB);
        let refused = overload.admit().unwrap_err();
        assert_eq!(refused, Overloaded { rss: 950 * MIB, limit: 1000 * MIB, share: 95, below: 850 * MIB });
        assert_eq!(
            refused.to_string(),
            "rota holds 996147200 bytes resident, 95% of its limit of 1048576000 (server.max_rss_bytes): Watch and xDS streams are refused until it falls below 891289600 bytes; picks go on"
        );
        assert_eq!(overload.refused(), 1);
    }

    #[tokio::test]
    async fn open_streams_are_told_to_end_only_when_shedding() {
        let overload = Arc::new(Overload::new(Some(1000 * MIB)));
        let waiting = tokio::spawn({
            let overload = overload.clone();
            async move { overload.shedding().await }
        });
        overload.observe(900 * MIB);
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "refusing leaves open streams alone");
        overload.observe(990 * MIB);
        let reason = waiting.await.unwrap();
        assert_eq!(reason.share, 99);
        assert_eq!(overload.shed(), 1);
    }

    #[test]
    fn the_resident_set_is_read() {
        let rss = resident_bytes().expect("/proc/self/statm is readable on Linux");
        assert!(rss > MIB, "a test process holds more than a MiB: {rss}");
    }
}
