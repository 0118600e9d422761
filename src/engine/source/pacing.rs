//! The bandwidth cap (`Config::max_bandwidth`, `Source::set_max_bandwidth`):
//! the transfer thread waits before it posts bytes that would take the
//! migration past the cap, averaged over what it sent since it last idled.

use std::time::{Duration, Instant};

pub(super) struct Pacer {
    /// When the bytes let through so far are paid for at the cap.
    due: Instant,
}

impl Pacer {
    pub fn new() -> Pacer {
        Pacer { due: Instant::now() }
    }

    /// How long to wait before `bytes` more may go at `rate` bytes per
    /// second (0: no cap); counts them as sent from then on. Time spent
    /// idle earns no burst.
    pub fn delay(&mut self, rate: u64, bytes: u64) -> Duration {
        let now = Instant::now();
        if rate == 0 {
            self.due = now;
            return Duration::ZERO;
        }
        let start = self.due.max(now);
        self.due = start + Duration::from_secs_f64(bytes as f64 / rate as f64);
        start - now
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_are_spaced_at_the_rate_and_idle_time_earns_nothing() {
        let mut p = Pacer::new();
        assert_eq!(p.delay(1000, 500), Duration::ZERO, "the first bytes go at once");
        let d = p.delay(1000, 500);
        assert!(d > Duration::from_millis(490) && d <= Duration::from_millis(500), "{d:?}");
        let d = p.delay(1000, 1);
        assert!(d > Duration::from_millis(990) && d <= Duration::from_millis(1000), "{d:?}");
        assert_eq!(p.delay(0, 1 << 30), Duration::ZERO, "no cap: at once, whatever was paced before");
        assert_eq!(p.delay(1000, 1), Duration::ZERO, "and nothing owed after it");
        let mut idle = Pacer::new();
        idle.due -= Duration::from_secs(10);
        assert_eq!(idle.delay(1000, 1000), Duration::ZERO);
        let d = idle.delay(1000, 1000);
        assert!(d > Duration::from_millis(990), "no credit for the idle 10 s: {d:?}");
    }
}
