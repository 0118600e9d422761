//! Where post-copy's connection is, on either side, for the hypervisor to
//! follow (its states: active, paused, recovering) and, with
//! `Config::postcopy_recovery_by_hypervisor`, to let a recovery begin.

use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::{Error, ErrorKind, Result};

/// How long a wait for the hypervisor's go goes without looking at an abort.
const GO_SLICE: Duration = Duration::from_millis(100);

/// Where post-copy's connection is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PostcopyLink {
    /// Connected (also before post-copy, and while it was never lost).
    #[default]
    Up,
    /// Lost during post-copy; a recovery may get it back within the window
    /// (`Config::postcopy_recovery`). With
    /// `Config::postcopy_recovery_by_hypervisor` it waits for the
    /// hypervisor's `postcopy_recover`; otherwise it goes on to `Recovering`
    /// by itself.
    Lost,
    /// The destination reconnects to the source, the source waits for it.
    Recovering,
    /// The connection ended (post-copy done, or it failed: the other calls
    /// say how). Final.
    Ended,
}

/// The link's state and the hypervisor's go for a recovery, shared by the
/// hypervisor's threads and the thread that runs post-copy.
pub(crate) struct LinkWatch {
    state: Mutex<Watched>,
    changed: Condvar,
    /// `Config::postcopy_recovery_by_hypervisor`.
    by_hypervisor: bool,
}

#[derive(Default)]
struct Watched {
    link: PostcopyLink,
    /// The hypervisor called `postcopy_recover` since the link was lost.
    go: bool,
}

impl LinkWatch {
    pub fn new(by_hypervisor: bool) -> LinkWatch {
        LinkWatch { state: Mutex::default(), changed: Condvar::new(), by_hypervisor }
    }

    /// The post-copy thread: the link is now `link` (nothing changes once `Ended`).
    pub fn set(&self, link: PostcopyLink) {
        let mut w = self.state.lock();
        if w.link == PostcopyLink::Ended || w.link == link {
            return;
        }
        if link == PostcopyLink::Lost {
            w.go = false;
        }
        w.link = link;
        self.changed.notify_all();
    }

    /// Waits until the link is not `known` (`None`: for ever), and returns
    /// where it is then.
    pub fn wait_change(&self, known: PostcopyLink, timeout: Option<Duration>) -> PostcopyLink {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut w = self.state.lock();
        while w.link == known {
            match deadline {
                Some(d) => {
                    if self.changed.wait_until(&mut w, d).timed_out() {
                        break;
                    }
                }
                None => self.changed.wait(&mut w),
            }
        }
        w.link
    }

    /// The hypervisor's go for a recovery of the lost link.
    pub fn recover(&self) -> Result<()> {
        if !self.by_hypervisor {
            return Err(Error::new(
                ErrorKind::State,
                "post-copy recovers by itself (Config::postcopy_recovery_by_hypervisor is off)",
            ));
        }
        let mut w = self.state.lock();
        match w.link {
            PostcopyLink::Lost => {
                w.go = true;
                w.link = PostcopyLink::Recovering;
                self.changed.notify_all();
                Ok(())
            }
            PostcopyLink::Recovering => Err(Error::new(ErrorKind::State, "post-copy's recovery already runs")),
            link => Err(Error::new(
                ErrorKind::State,
                format!("post-copy's connection is not lost ({link:?}): nothing to recover"),
            )),
        }
    }

    /// The post-copy thread, with the link `lost`: waits for the
    /// hypervisor's go until `deadline`, calling `check` (an abort, the
    /// peer's disconnect) at least every `GO_SLICE`; fails as `lost` did,
    /// saying so, once the deadline passed without it.
    pub fn await_go(&self, deadline: Instant, lost: &Error, mut check: impl FnMut() -> Result<()>) -> Result<()> {
        loop {
            check()?;
            if self.wait_go((Instant::now() + GO_SLICE).min(deadline)) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(Error::new(
                    lost.kind,
                    format!("{}; no recovery: the hypervisor did not call postcopy_recover in time", lost.message),
                ));
            }
        }
    }

    /// Waits until `until` for the hypervisor's go; whether it came.
    fn wait_go(&self, until: Instant) -> bool {
        let mut w = self.state.lock();
        while !w.go && w.link != PostcopyLink::Ended {
            if self.changed.wait_until(&mut w, until).timed_out() {
                break;
            }
        }
        w.go
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovery_needs_a_lost_link_and_ended_is_final() {
        let watch = LinkWatch::new(true);
        assert_eq!(watch.recover().unwrap_err().kind, ErrorKind::State);
        watch.set(PostcopyLink::Lost);
        assert!(!watch.wait_go(Instant::now()));
        watch.recover().unwrap();
        assert_eq!(watch.wait_change(PostcopyLink::Lost, Some(Duration::ZERO)), PostcopyLink::Recovering);
        assert!(watch.wait_go(Instant::now()));
        assert_eq!(watch.recover().unwrap_err().kind, ErrorKind::State);
        // A second loss needs a second go.
        watch.set(PostcopyLink::Up);
        watch.set(PostcopyLink::Lost);
        assert!(!watch.wait_go(Instant::now()));
        watch.set(PostcopyLink::Ended);
        watch.set(PostcopyLink::Up);
        assert_eq!(watch.wait_change(PostcopyLink::Up, Some(Duration::ZERO)), PostcopyLink::Ended);
        let by_itself = LinkWatch::new(false);
        by_itself.set(PostcopyLink::Lost);
        assert_eq!(by_itself.recover().unwrap_err().kind, ErrorKind::State);
    }

    #[test]
    fn the_go_is_awaited_until_the_deadline_with_checks_between() {
        let watch = LinkWatch::new(true);
        watch.set(PostcopyLink::Lost);
        let lost = Error::new(ErrorKind::Timeout, "lost");
        let mut checks = 0;
        let e = watch.await_go(Instant::now() + Duration::from_millis(250), &lost, || {
            checks += 1;
            Ok(())
        });
        assert_eq!(e.unwrap_err().kind, ErrorKind::Timeout);
        assert!(checks >= 3, "{checks} checks in 250 ms");
        let aborted = watch
            .await_go(Instant::now() + Duration::from_secs(10), &lost, || Err(Error::new(ErrorKind::Aborted, "abort")));
        assert_eq!(aborted.unwrap_err().kind, ErrorKind::Aborted);
        watch.recover().unwrap();
        watch.await_go(Instant::now(), &lost, || Ok(())).unwrap();
    }

    #[test]
    fn a_waiter_sees_each_change() {
        let watch = std::sync::Arc::new(LinkWatch::new(false));
        let w = watch.clone();
        let t = std::thread::spawn(move || w.wait_change(PostcopyLink::Up, None));
        std::thread::sleep(Duration::from_millis(20));
        watch.set(PostcopyLink::Lost);
        assert_eq!(t.join().unwrap(), PostcopyLink::Lost);
        assert_eq!(watch.wait_change(PostcopyLink::Lost, Some(Duration::from_millis(10))), PostcopyLink::Lost);
    }
}
