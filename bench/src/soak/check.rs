//! The checker: the orders tables, the queues and the processes at the end,
//! judged against the ledger and the faults. Every finding is a violation
//! with the order or the process it is about.
//!
//! For every order the order services placed:
//! - paid (the payer's update hit), or `paid` at the gateway: never cancelled;
//! - never cancelled before its deadline (after an extension, the new one);
//! - otherwise cancelled, within the bound: `due + BASE_BOUND`, or for an
//!   order whose time in flight (created to cancelled) a fault overlapped,
//!   `max(due, recovered) + bound` of that fault (the largest such); for a
//!   cluster node killed, stopped or hung, `due + bound` (10 s, 30 s hung),
//!   whenever the node returns;
//! - cancelled by the sweeper only if it was never scheduled (its message
//!   never reached the broker); a scheduled order swept means the ladder
//!   missed it by more than the sweeper's grace.
//!
//! At the end: the ladder and due queues of both worlds empty; the sql world's
//! parked queue holds exactly the poison messages sent (a copy more allowed
//! for each publish that went out without a confirm), the http world's none;
//! no `serve` exited on its own; memory flat (runs of 20 minutes or more);
//! bursts made bundles (a tenth of the burst orders at least reached the
//! consumers in due messages that carried more than one order).

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use order_expiry_testkit::world::OrderRow;

use super::bundles::Bundling;
use super::faults::{BASE_BOUND, Record};
use super::memory::Samples;
use super::traffic::{Gateway, Ledger, Order, Poison, Route};
use super::world::{SERVES, SWEEP_GRACE, Which};

/// One cancelled order, for the plot and the per-fault lines.
#[derive(Debug, Clone)]
pub(super) struct Cancel {
    pub(super) due_at: DateTime<Utc>,
    pub(super) late: Duration,
    pub(super) swept: bool,
}

/// What the checker found.
#[derive(Debug, Default)]
pub(super) struct Verdict {
    pub(super) orders: usize,
    pub(super) cancelled: usize,
    pub(super) paid: usize,
    pub(super) kept_by_gateway: usize,
    pub(super) extended: usize,
    pub(super) swept: usize,
    pub(super) swept_explained: usize,
    pub(super) never_scheduled: usize,
    pub(super) cancels: Vec<Cancel>,
    /// Per fault (index into the records): the orders whose bound it set (of
    /// the faults that overlapped an order's time in flight, the one whose
    /// repair plus bound came last), and the worst lateness among them.
    pub(super) per_fault: Vec<(usize, Duration)>,
    pub(super) violations: Vec<String>,
}

/// The state at the end, read by the soak.
#[derive(Debug)]
pub(super) struct End {
    pub(super) ledger: Ledger,
    pub(super) poison: Poison,
    pub(super) faults: Vec<Record>,
    /// The world of each `serve` slot.
    pub(super) slot_worlds: [Which; SERVES.len()],
    pub(super) sql_rows: HashMap<String, OrderRow>,
    pub(super) http_rows: HashMap<String, OrderRow>,
    /// Queue name -> messages, of both worlds' prefixes.
    pub(super) queues: Vec<(String, u64)>,
    pub(super) sql_parked_queue: String,
    pub(super) exited: Vec<String>,
    pub(super) memory: Samples,
    /// Orders per due message, as the `serve` processes decoded them.
    pub(super) bundling: Bundling,
    pub(super) duration: Duration,
}

/// Judges `end`.
pub(super) fn check(end: &End) -> Verdict {
    let mut v = Verdict {
        orders: end.ledger.orders.len(),
        per_fault: vec![(0, Duration::ZERO); end.faults.len()],
        ..Verdict::default()
    };
    for order in &end.ledger.orders {
        let rows = match order.which {
            Which::Sql => &end.sql_rows,
            Which::Http => &end.http_rows,
        };
        match rows.get(&order.id) {
            Some(row) => judge(end, order, row, &mut v),
            // Its INSERT never committed (the database was away for a minute).
            None if !order.scheduled => v.never_scheduled += 1,
            None => v
                .violations
                .push(format!("{}: scheduled but no row", order.id)),
        }
    }
    for fault in &end.faults {
        if let Some(e) = &fault.error {
            v.violations.push(format!(
                "fault {} at {}: injecting or repairing it failed: {e}",
                fault.kind.label(),
                fault.started.format("%H:%M:%S")
            ));
        }
    }
    check_queues(end, &mut v);
    for name in &end.exited {
        v.violations
            .push(format!("{name} exited on its own (not killed by a fault)"));
    }
    if end.duration >= Duration::from_secs(20 * 60) {
        v.violations.extend(end.memory.growth());
    }
    let bursts = end.ledger.orders.iter().filter(|o| o.burst).count() as u64;
    if end.bundling.bundled_orders() < bursts / 10 {
        v.violations.push(format!(
            "bundles did not form: {bursts} burst orders placed, {} orders came in \
             bundles ({} bundles of {} due messages read)",
            end.bundling.bundled_orders(),
            end.bundling.bundles,
            end.bundling.messages
        ));
    }
    v
}

fn judge(end: &End, order: &Order, row: &OrderRow, v: &mut Verdict) {
    let kept_by_gateway = order.gateway == Gateway::Paid;
    v.paid += usize::from(order.paid);
    v.kept_by_gateway += usize::from(kept_by_gateway && !order.paid);
    v.extended += usize::from(order.extended_from.is_some());
    if !order.scheduled {
        v.never_scheduled += 1;
    }
    let Some(cancelled_at) = row.cancelled_at else {
        if row.status == "unpaid" && !kept_by_gateway && !order.paid && order.scheduled {
            v.violations.push(format!(
                "{}: lost: due {}, still unpaid at the end",
                order.id,
                row.pay_deadline.format("%H:%M:%S%.3f")
            ));
        }
        if row.status == "unpaid" && order.route == Route::Unscheduled {
            v.violations
                .push(format!("{}: never scheduled and never swept", order.id));
        }
        return;
    };
    v.cancelled += 1;
    if order.paid || row.status == "paid" {
        v.violations.push(format!(
            "{}: paid, yet cancelled at {cancelled_at}",
            order.id
        ));
    }
    if kept_by_gateway {
        v.violations.push(format!(
            "{}: the gateway said paid, yet cancelled at {cancelled_at}",
            order.id
        ));
    }
    let swept = row.cancelled_by.as_deref() == Some("sweeper");
    if swept {
        v.swept += 1;
        if order.scheduled {
            v.violations.push(format!(
                "{}: scheduled, yet cancelled by the sweeper ({} past its deadline): \
                 the ladder missed it by more than the sweeper's grace",
                order.id,
                fmt_late(cancelled_at - row.pay_deadline)
            ));
        } else {
            v.swept_explained += 1;
        }
    } else if order.route == Route::Unscheduled {
        v.violations.push(format!(
            "{}: never scheduled, yet cancelled by the ladder",
            order.id
        ));
    }
    let Ok(late) = (cancelled_at - row.pay_deadline).to_std() else {
        v.violations.push(format!(
            "{}: early: cancelled {} before its deadline {}",
            order.id,
            fmt_late(row.pay_deadline - cancelled_at),
            row.pay_deadline.format("%H:%M:%S%.3f")
        ));
        return;
    };
    let mut limit = row.pay_deadline + delta(BASE_BOUND);
    if order.gateway == Gateway::PendingThenUnpaid {
        // steps_ms starts at 1 s: the second question comes a second later.
        limit += TimeDelta::seconds(1);
    }
    if !order.scheduled {
        limit += delta(SWEEP_GRACE) + TimeDelta::seconds(1);
    }
    // The fault whose repair and bound set the limit: the order's lateness is
    // put down to it in the report (a never-scheduled order waits for the
    // sweeper's grace by design, and is put down to none).
    let mut binding = None;
    for (i, fault) in end.faults.iter().enumerate() {
        let in_flight = fault.started <= cancelled_at && fault.recovered >= order.created;
        if in_flight
            && fault
                .kind
                .affects(order.which, |slot| end.slot_worlds[slot])
        {
            let from = match fault.kind.counts_from_due() {
                true => row.pay_deadline,
                false => row.pay_deadline.max(fault.recovered),
            };
            let fault_limit = from + delta(fault.kind.bound());
            if fault_limit > limit {
                limit = fault_limit;
                binding = Some(i);
            }
        }
    }
    if let (Some(i), true) = (binding, order.scheduled) {
        let (n, worst) = &mut v.per_fault[i];
        *n += 1;
        *worst = (*worst).max(late);
    }
    if cancelled_at > limit {
        v.violations.push(format!(
            "{}: {} late (due {}), beyond its bound by {}",
            order.id,
            fmt_late(cancelled_at - row.pay_deadline),
            row.pay_deadline.format("%H:%M:%S%.3f"),
            fmt_late(cancelled_at - limit)
        ));
    }
    v.cancels.push(Cancel {
        due_at: row.pay_deadline,
        late,
        swept,
    });
}

fn check_queues(end: &End, v: &mut Verdict) {
    for (name, messages) in &end.queues {
        let expected = end.poison.expected(&end.sql_parked_queue, name);
        if !expected.contains(messages) {
            let (lo, hi) = expected.into_inner();
            let expected = match lo == hi {
                true => lo.to_string(),
                false => format!("{lo}-{hi}"),
            };
            v.violations.push(format!(
                "queue {name}: {messages} messages at the end, {expected} expected"
            ));
        }
    }
    if !end
        .queues
        .iter()
        .any(|(name, _)| *name == end.sql_parked_queue)
    {
        v.violations
            .push(format!("queue {} missing at the end", end.sql_parked_queue));
    }
}

fn delta(d: Duration) -> TimeDelta {
    TimeDelta::from_std(d).unwrap_or(TimeDelta::MAX)
}

/// A signed time difference as `1.234 s`.
pub(super) fn fmt_late(d: TimeDelta) -> String {
    format!("{:.3} s", d.num_milliseconds() as f64 / 1000.0)
}

#[cfg(test)]
mod tests {
    use order_expiry_testkit::Placed;

    use super::*;
    use crate::soak::faults::Kind;

    fn at(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + s, 0).expect("a time")
    }

    fn order(id: &str, due: i64) -> Order {
        Order {
            placed: Placed {
                id: id.into(),
                due_at: at(due),
                scheduled: true,
                paid: false,
            },
            which: Which::Sql,
            route: Route::Library,
            burst: false,
            created: at(0),
            extended_from: None,
            gateway: Gateway::Unpaid,
        }
    }

    fn row(due: i64, cancelled: Option<i64>, by: Option<&str>) -> OrderRow {
        let status = if cancelled.is_some() {
            "cancelled"
        } else {
            "unpaid"
        };
        OrderRow {
            status: status.into(),
            pay_deadline: at(due),
            paid_at: None,
            cancelled_at: cancelled.map(at),
            cancelled_by: by.map(str::to_owned),
        }
    }

    fn fault(kind: Kind, started: i64, recovered: i64) -> Record {
        Record {
            kind,
            started: at(started),
            recovered: at(recovered),
            error: None,
        }
    }

    /// The checker's verdict on one sql-world order and its row, with
    /// `faults`, in an end that is clean otherwise.
    fn verdict(order: Order, row: OrderRow, faults: &[Record]) -> Verdict {
        let mut end = clean();
        end.sql_rows = HashMap::from([(order.id.clone(), row)]);
        end.http_rows.clear();
        end.ledger.orders = vec![order];
        end.faults = faults.to_vec();
        check(&end)
    }

    #[test]
    fn on_time_passes_and_each_broken_promise_is_a_violation() {
        assert!(
            verdict(order("a", 10), row(10, Some(11), None), &[])
                .violations
                .is_empty()
        );
        let mut paid = order("a", 10);
        paid.placed.paid = true;
        let cases = [
            (order("a", 10), row(10, Some(9), None), "early"),
            (order("a", 10), row(10, None, None), "lost"),
            (order("a", 10), row(10, Some(16), None), "beyond its bound"),
            (paid, row(10, Some(11), None), "paid, yet cancelled"),
            (
                order("a", 10),
                row(10, Some(131), Some("sweeper")),
                "by the sweeper",
            ),
        ];
        for (order, row, what) in cases {
            let v = verdict(order, row, &[]);
            let first = v.violations.first();
            assert!(first.is_some_and(|f| f.contains(what)), "{what}: {v:?}");
        }
    }

    #[test]
    fn a_node_fault_is_bounded_from_the_due_time_whenever_the_node_returns() {
        let down = Duration::from_secs(65);
        let kill = fault(Kind::NodeKill { node: 1, down }, 5, 70);
        let hang = fault(
            Kind::NodePause {
                node: 1,
                hung: down,
            },
            5,
            70,
        );
        // Due at 10, the node back at 70: a kill allows 10 s past due, a
        // hang 30 s, not the node's return.
        let ok = |kind: &Record, late: i64| {
            let row = row(10, Some(10 + late), None);
            let v = verdict(order("a", 10), row, std::slice::from_ref(kind));
            v.violations.is_empty()
        };
        assert!(ok(&kill, 10) && !ok(&kill, 11));
        assert!(ok(&hang, 30) && !ok(&hang, 31));
    }

    #[test]
    fn a_fault_in_flight_stretches_the_bound_from_its_repair_and_only_for_its_world() {
        let detect = Duration::from_secs(5);
        let failover = fault(Kind::DatabaseFailover { detect }, 5, 30);
        // Due at 10, promoted at 30: 10 s + 5 s past the promotion is allowed.
        let cancelled_at_44 = || (order("a", 10), row(10, Some(44), None));
        let (o, r) = cancelled_at_44();
        let v = verdict(o, r, std::slice::from_ref(&failover));
        assert!(v.violations.is_empty(), "{:?}", v.violations);
        assert_eq!(v.per_fault, vec![(1, Duration::from_secs(34))]);
        // Of two faults, the one repaired last (plus its bound) is the
        // order's: the report puts its lateness down to that one.
        let lasting = Duration::from_secs(30);
        let blackhole = fault(Kind::DatabaseBlackhole { lasting }, 8, 38);
        let (o, r) = cancelled_at_44();
        let v = verdict(o, r, &[failover.clone(), blackhole]);
        assert!(v.violations.is_empty(), "{:?}", v.violations);
        assert_eq!(
            v.per_fault,
            vec![(0, Duration::ZERO), (1, Duration::from_secs(34))]
        );
        let v = verdict(order("a", 10), row(10, Some(46), None), &[failover]);
        assert_eq!(v.violations.len(), 1, "{:?}", v.violations);
        // A restart of the http world's PostgreSQL cannot excuse the sql
        // world, whose orders live on the pair; nor can a gateway outage.
        let lasting = Duration::from_secs(20);
        let gateway = Kind::GatewayDown {
            lasting,
            hangs: false,
        };
        for kind in [Kind::PostgresRestart, gateway] {
            let row = row(10, Some(20), None);
            let v = verdict(order("a", 10), row, &[fault(kind, 5, 30)]);
            assert_eq!(v.violations.len(), 1, "{kind:?}: {:?}", v.violations);
        }
    }

    #[test]
    fn never_scheduled_orders_must_be_swept_and_only_they_may_be() {
        let mut unscheduled = order("u", 10);
        unscheduled.route = Route::Unscheduled;
        unscheduled.placed.scheduled = false;
        let swept_row = row(10, Some(131), Some("sweeper"));
        let swept = verdict(unscheduled.clone(), swept_row, &[]);
        assert!(swept.violations.is_empty(), "{:?}", swept.violations);
        assert_eq!((swept.swept, swept.swept_explained), (1, 1));
        let never = verdict(unscheduled.clone(), row(10, None, None), &[]);
        assert!(never.violations[0].contains("never swept"), "{never:?}");
        let by_ladder = verdict(unscheduled, row(10, Some(11), None), &[]);
        assert!(
            by_ladder.violations[0].contains("by the ladder"),
            "{by_ladder:?}"
        );
    }

    /// One sql order and one http order, both cancelled on time; one burst
    /// order, and bundles seen; one poison message, parked.
    fn clean() -> End {
        let mut http = order("h", 10);
        http.which = Which::Http;
        let mut burst = order("b", 10);
        burst.burst = true;
        End {
            ledger: Ledger {
                orders: vec![order("s", 10), http, burst],
                ..Ledger::default()
            },
            poison: Poison {
                confirmed: 1,
                unsure: 0,
            },
            faults: Vec::new(),
            slot_worlds: [Which::Sql, Which::Sql, Which::Http],
            sql_rows: HashMap::from([
                ("s".to_owned(), row(10, Some(11), None)),
                ("b".to_owned(), row(10, Some(11), None)),
            ]),
            http_rows: HashMap::from([("h".to_owned(), row(10, Some(11), None))]),
            queues: vec![("p.parked".to_owned(), 1), ("p.due".to_owned(), 0)],
            sql_parked_queue: "p.parked".into(),
            exited: Vec::new(),
            memory: Samples::default(),
            // 19 orders in 1 bundle, 9 messages of one order.
            bundling: Bundling {
                messages: 10,
                orders: 28,
                bundles: 1,
            },
            duration: Duration::from_secs(60),
        }
    }

    /// A clean end broken by `breaking` gives exactly one violation, which
    /// says `what`.
    fn one_violation(breaking: impl FnOnce(&mut End), what: &str) {
        let mut end = clean();
        breaking(&mut end);
        let found = check(&end).violations;
        assert_eq!(found.len(), 1, "{what}: {found:?}");
        assert!(found[0].contains(what), "{what}: {found:?}");
    }

    #[test]
    fn every_violation_class_is_found() {
        assert_eq!(check(&clean()).violations, Vec::<String>::new());
        type Breaking = fn(&mut End);
        let cases: [(Breaking, &str); 10] = [
            (
                |c| c.ledger.orders[1].gateway = Gateway::Paid,
                "the gateway said paid, yet cancelled",
            ),
            (|c| drop(c.sql_rows.remove("s")), "s: scheduled but no row"),
            // The http world is judged by its own rows.
            (
                |c| drop(c.http_rows.insert("h".into(), row(10, Some(9), None))),
                "h: early",
            ),
            (
                |c| drop(c.http_rows.insert("h".into(), row(10, None, None))),
                "h: lost",
            ),
            (
                |c| c.queues[1].1 = 3,
                "queue p.due: 3 messages at the end, 0 expected",
            ),
            (
                |c| c.queues[0].1 = 2,
                "queue p.parked: 2 messages at the end, 1 expected",
            ),
            (
                |c| {
                    c.poison.unsure = 1;
                    c.queues[0].1 = 3;
                },
                "queue p.parked: 3 messages at the end, 1-2 expected",
            ),
            (|c| drop(c.queues.remove(0)), "p.parked missing"),
            (
                |c| c.exited.push("serve-sql-1".into()),
                "serve-sql-1 exited on its own",
            ),
            (
                |c| {
                    let mut replay = fault(Kind::ParkedReplay, 50, 51);
                    replay.error = Some("exit 1".into());
                    c.faults.push(replay);
                },
                "injecting or repairing it failed: exit 1",
            ),
        ];
        for (breaking, what) in cases {
            one_violation(breaking, what);
        }
        // A publish sent without a confirm may have landed before the one
        // that was confirmed: one copy more is allowed for it, not two (above).
        let mut unsure = clean();
        unsure.poison.unsure = 1;
        unsure.queues[0].1 = 2;
        assert_eq!(check(&unsure).violations, Vec::<String>::new());
        one_violation(
            |c| {
                c.ledger.orders[2].burst = false;
                for i in 0..200 {
                    let id = format!("b{i}");
                    c.ledger.orders.push(Order {
                        burst: true,
                        ..order(&id, 10)
                    });
                    c.sql_rows.insert(id, row(10, Some(11), None));
                }
            },
            "bundles did not form: 200 burst orders placed, 19 orders came in bundles",
        );
        let grow = |c: &mut End| {
            for minute in 0..=20 {
                let rss = if minute < 19 { 200 } else { 400 } << 20;
                c.memory.push("serve-sql-1", 7, at(minute * 60), rss);
            }
        };
        // Memory is judged on runs of 20 minutes or more only.
        let mut short = clean();
        grow(&mut short);
        assert_eq!(check(&short).violations, Vec::<String>::new());
        one_violation(
            |c| {
                grow(c);
                c.duration = Duration::from_secs(20 * 60);
            },
            "serve-sql-1 (pid 7) grew from 200 MB (minutes 5-10) to 400 MB",
        );
    }
}
