//! One resource's queue of this client's waiters: who is head, which
//! tickets a release named, which notices were already counted.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::Notify;

use super::RECENT_NOTICES;
use crate::waiting::pregrant::{Home, Orphan, Pregrant};

#[derive(Debug, Default)]
pub(super) struct Queue {
    /// Waiters in arrival order; the first is the head. Each with its fair
    /// queue ticket, if it has one.
    pub(super) waiters: VecDeque<(u64, Arc<Notify>, Option<Arc<str>>)>,
    /// A fair queue's home node, whose notices name the next ticket:
    /// subscribed there only (`None`: on every node, the classic
    /// competition; a fair queue whose home stopped answering is widened
    /// to that, see [`Place::widen`]).
    pub(super) fair: Option<usize>,
    /// When this client's first fair waiter should look at the queue
    /// although no release named a ticket of ours: a release named a
    /// ticket of ours whose waiter left.
    pub(super) look_at: Option<Instant>,
    /// Tickets of this client's waiters that left (cancelled, gave up):
    /// a release that names one passes the turn to our first waiter.
    pub(super) left: VecDeque<Arc<str>>,
    /// Tickets this client issued whose waiter is gone (left, or got the
    /// lock), the last [`GONE_TICKETS`](super::GONE_TICKETS): a pre-grant to one of them is an
    /// [`Orphan`] to release, a pre-grant to a ticket it never issued is
    /// not its to touch.
    pub(super) gone: VecDeque<Arc<str>>,
    /// Local waiters whose ticket a release named, not yet taken, with
    /// the home's vote when the release pre-granted it.
    pub(super) named: Vec<(u64, Option<Pregrant>)>,
    /// The fair queue's home, for releasing an [`Orphan`].
    pub(super) home: Option<Home>,
    /// Local waiters whose ticket another waiter of this client found at
    /// the head of the queue with no release to name it: they attempt (see
    /// [`Place::prod`]).
    pub(super) prodded: Vec<u64>,
    /// Whether this client's last release (or notice) found tickets in the
    /// fair queue: other clients wait in it, so a new waiter joins it
    /// instead of sending an attempt bound to fail.
    pub(super) busy: bool,
    /// First attempts of this client's fair acquires in flight without a
    /// place ([`Waits::first_attempt`](super::Waits::first_attempt)): a
    /// new waiter joins behind them, as it would behind a waiter.
    pub(super) attempting: u32,
    /// Releases heard (and subscription confirmations, which stand for any
    /// release missed before them). The head retries when it moves.
    pub(super) heard: u64,
    pub(super) recent: VecDeque<Arc<str>>,
    /// Copies of the last notice heard (one per node that published it).
    pub(super) copies: usize,
    /// Releases known done on a majority of the nodes: a notice whose
    /// copies reached a majority (the first copy on one node), this
    /// client's own release queued on every connection, a subscription's
    /// confirmation (which stands for any release missed before it).
    /// `wait_any`'s waiters retry on it, not on a notice's first copy: a
    /// retry at the first copy can meet nodes that have not deleted yet,
    /// and every waiting client retrying twice per release is a herd.
    pub(super) settled: u64,
    /// When `settled` last moved.
    pub(super) last_settled: Option<Instant>,
    /// Clients subscribed to the resource on the node of the last release
    /// heard (us included): how many heads may be retrying at once.
    pub(super) competitors: u64,
    /// `heard` when the current head became head: releases heard after it
    /// are for the head, even if it only looks later.
    pub(super) head_since: u64,
    /// Whether some node confirmed the subscription.
    pub(super) subscribed: bool,
    /// Whether the subscription was asked for: a fair queue listens only
    /// once a waiter must wait ([`Waits::listen`](super::Waits::listen)), so an acquire of a free
    /// resource subscribes to nothing.
    pub(super) listening: bool,
    /// Expiry of the keys of the last local waiter that got the lock: the
    /// next head's TTL wake-up.
    pub(super) holder_until: Option<Instant>,
    /// When the last release was heard: a waiter that joins a lingering
    /// queue retries at once if one was heard after its attempt began.
    pub(super) last_heard: Option<Instant>,
    /// Since when the queue has had no waiters (it lingers, subscribed,
    /// for [`LINGER`](super::LINGER)).
    pub(super) idle_since: Option<Instant>,
    /// Until when this client's last join or look asked the home node to
    /// keep the fair queue's key (`PEXPIRE`): a join whose waiter needs no
    /// more leaves the `PEXPIRE` out.
    pub(super) kept_until: Option<Instant>,
    /// Releases of this client handed straight to its own head since a
    /// release was last heard through Redis (see
    /// [`DEFAULT_LOCAL_HANDOFFS`](super::DEFAULT_LOCAL_HANDOFFS)).
    pub(super) local_turns: u32,
    pub(super) next_id: u64,
}

impl Queue {
    /// The home node's release named `next`: wake that waiter if it is
    /// ours. A vote pre-granted to a ticket no waiter of ours holds comes
    /// back as an [`Orphan`], to release.
    pub(super) fn turn(
        &mut self,
        key: &str,
        next: &str,
        pregrant: Option<Pregrant>,
    ) -> Option<Orphan> {
        self.busy = true;
        if let Some((id, notify, _)) = self
            .waiters
            .iter()
            .find(|(_, _, t)| t.as_deref() == Some(next))
        {
            match self.named.iter_mut().find(|(named, _)| named == id) {
                // Named again before it took the first naming: a plain
                // naming (the key on the home is held, by the pre-grant
                // itself as likely as not) keeps the vote the first one
                // carried; a new pre-grant means the old key was deleted.
                Some((_, kept)) => {
                    if let Some(mut pregrant) = pregrant {
                        // Keys an earlier handover left stay this
                        // waiter's to replace.
                        if pregrant.handed.is_none() {
                            pregrant.handed = kept.as_mut().and_then(|k| k.handed.take());
                        }
                        *kept = Some(pregrant);
                    }
                }
                None => self.named.push((*id, pregrant)),
            }
            notify.notify_one();
            return None;
        }
        if self.left.iter().any(|t| **t == *next) {
            // Named a waiter of ours that left: our first waiter looks now
            // (the queue's new head may be free to go).
            self.look_at = Some(Instant::now());
            self.wake_head();
        }
        // Only a ticket this client issued is its orphan to release. A
        // ticket on this client's channel that it never issued is another
        // live client's whose tag is the same (or planted by hand):
        // releasing it deleted that client's pre-granted key and gave the
        // home's vote to the next ticket, two holders (issue 31, with
        // 32-bit tags). It is left alone: its own client uses it, or it
        // expires with its TTL.
        if !self.gone.iter().any(|t| **t == *next) {
            return None;
        }
        self.orphan(key, next.into(), pregrant)
    }

    /// The [`Orphan`] of `pregrant`, if any and the home is known.
    pub(super) fn orphan(
        &self,
        key: &str,
        ticket: Arc<str>,
        pregrant: Option<Pregrant>,
    ) -> Option<Orphan> {
        let pregrant = pregrant?;
        Some(Orphan {
            key: key.into(),
            home: self.home.clone()?,
            ticket,
            notice: pregrant.notice,
            handed: pregrant.handed,
        })
    }

    /// Tells the waiter holding `ticket`, if it is here, to attempt while
    /// queued: its ticket is at the head and the lock was free.
    pub(super) fn prod(&mut self, ticket: &str) -> bool {
        let Some((id, notify, _)) = self
            .waiters
            .iter()
            .find(|(_, _, t)| t.as_deref() == Some(ticket))
        else {
            return false;
        };
        let id = *id;
        notify.notify_one();
        self.prodded.push(id);
        true
    }

    /// Counts `notice` as heard: its copies from other nodes are ignored.
    pub(super) fn remember(&mut self, notice: Arc<str>) {
        if self.recent.len() == RECENT_NOTICES {
            self.recent.pop_front();
        }
        self.recent.push_back(notice);
        self.copies = 1;
    }

    /// Another node's copy of a notice already heard: when it is the last
    /// notice's and completes a majority of `nodes`, the release is
    /// settled (the mutex's waiters, which retry on `heard`, are not woken
    /// twice; `wait_any`'s retry on `settled`).
    pub(super) fn copy(&mut self, notice: &str, nodes: usize) {
        if self.recent.back().is_none_or(|last| **last != *notice) {
            return;
        }
        self.copies += 1;
        if self.copies == nodes / 2 + 1 {
            self.settle();
        }
    }

    /// A release known done on a majority: moves `settled` and wakes the
    /// head (without moving `heard`).
    pub(super) fn settle(&mut self) {
        self.settled += 1;
        self.last_settled = Some(Instant::now());
        if let Some((_, notify, _)) = self.waiters.front() {
            notify.notify_one();
        }
    }

    pub(super) fn wake_head(&mut self) {
        self.heard += 1;
        if let Some((_, notify, _)) = self.waiters.front() {
            notify.notify_one();
        }
    }
}
