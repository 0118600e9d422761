//! The bandwidth cap (`Config::max_bandwidth`, `Source::set_max_bandwidth`):
//! the transfer thread waits before it posts bytes that would take the
//! migration past the cap, averaged over what it sent since it last idled.

use std::time::{Duration, Instant};

pub(super) struct Pacer {
    /// When the bytes let through so far are paid for at the cap; `None`
    /// since bytes went uncapped (nothing owed).
    due: Option<Instant>,
}

impl Pacer {
    pub fn new() -> Pacer {
        Pacer { due: None }
    }

    /// Bytes went with no cap: nothing is owed. (No clock read: this runs
    /// for every write, and a clock read was a tenth of the source's CPU
    /// path per write; docs/benchmarks.md.)
    pub fn uncapped(&mut self) {
        self.due = None;
    }

    /// How long after `now` to wait before `bytes` more may go at `rate`
    /// bytes per second (0: no cap); counts them as sent from then on. Time
    /// spent idle earns no burst.
    pub fn delay(&mut self, now: Instant, rate: u64, bytes: u64) -> Duration {
        if rate == 0 {
            self.uncapped();
            return Duration::ZERO;
        }
        let start = self.due.map_or(now, |due| due.max(now));
        self.due = Some(start + Duration::from_secs_f64(bytes as f64 / rate as f64));
        start - now
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_are_spaced_at_the_rate_and_idle_time_earns_nothing() {
        let ms = Duration::from_millis;
        let t0 = Instant::now();
        let mut p = Pacer::new();
        assert_eq!(p.delay(t0, 1000, 500), Duration::ZERO, "the first bytes go at once");
        assert_eq!(p.delay(t0, 1000, 500), ms(500));
        assert_eq!(p.delay(t0 + ms(100), 1000, 1), ms(900), "waits out what was sent before");
        assert_eq!(p.delay(t0 + ms(100), 0, 1 << 30), Duration::ZERO, "no cap: at once, whatever was paced before");
        assert_eq!(p.delay(t0 + ms(100), 1000, 1), Duration::ZERO, "and nothing owed after it");
        // Ten idle seconds later: the first bytes go at once, the next wait their full time.
        let later = t0 + Duration::from_secs(10);
        assert_eq!(p.delay(later, 1000, 1000), Duration::ZERO);
        assert_eq!(p.delay(later, 1000, 1000), ms(1000), "no credit for the idle time");
    }
}
