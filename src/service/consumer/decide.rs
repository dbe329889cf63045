//! What happens to a due message after the payment check and after the
//! action: ack it with an outcome, retry it alone, park it, or send it through
//! the ladder again (the next check step; an order not found yet). Pure.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::Outcome;
use crate::publisher::ExpiryMessage;
use crate::service::action::{ActionAnswer, CheckAnswer, Checked};
use crate::settings::{CheckSettings, FinalOutcome};

/// What happens to one due message next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Next {
    /// Handled: ack it, counted with this outcome.
    Ack(Outcome),
    /// Not now: retry it alone after its own backoff.
    Retry(String),
    /// Never as it is: copy it to the parked queue with this reason, then ack.
    Park(String),
    /// Publish this message through the ladder (confirmed), then ack the
    /// delivery, counted with this outcome.
    Requeue(ExpiryMessage, Outcome),
    /// Not due yet by the reference clock (named): hold it this long, then
    /// try again. Neither acked nor retried on a backoff.
    Hold(&'static str, Duration),
}

/// After the payment check: apply the action, or something else first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum AfterCheck {
    /// Unpaid at the gateway (or pending past the last step with `final =
    /// cancel`): apply the action.
    Act,
    /// Not the action.
    Then(Next),
}

/// What the check's answer about `message` leads to, at `now`. A `pending`
/// answer to check `n` (its `check_step`) sends it through the ladder to be
/// checked again `steps[n]` later, until there is no step left.
pub(super) fn after_check(
    checked: Checked,
    message: &ExpiryMessage,
    check: &CheckSettings,
    now: DateTime<Utc>,
) -> AfterCheck {
    let answer = match checked {
        Checked::Answer(answer) => answer,
        Checked::Retry(reason) => return AfterCheck::Then(Next::Retry(reason)),
        Checked::Park(reason) => return AfterCheck::Then(Next::Park(reason)),
    };
    match answer {
        CheckAnswer::Paid => AfterCheck::Then(Next::Ack(Outcome::PaidAtGateway)),
        CheckAnswer::Unpaid => AfterCheck::Act,
        CheckAnswer::Pending => match check.steps.get(message.check_step as usize) {
            Some(step) => {
                let mut next = message.again_at(now + *step);
                next.check_step = message.check_step.saturating_add(1);
                AfterCheck::Then(Next::Requeue(next, Outcome::CheckRequeued))
            }
            None => match check.final_outcome {
                FinalOutcome::Cancel => AfterCheck::Act,
                FinalOutcome::Keep => AfterCheck::Then(Next::Ack(Outcome::PendingAtGateway)),
                FinalOutcome::Park => AfterCheck::Then(Next::Park(format!(
                    "payment still pending at the gateway after {} checks (action.check.steps_ms); \
                     nothing cancelled (action.check.final = park)",
                    message.check_step.saturating_add(1)
                ))),
            },
        },
    }
}

/// What the action's verdict about `message` leads to, at `now`. An order not
/// found is looked for again `rechecks[n]` later (its `unknown_rechecks` is
/// `n`), through the ladder, until there is no recheck left: then it is
/// acked as unknown.
pub(super) fn after_action(
    verdict: ActionAnswer,
    message: &ExpiryMessage,
    rechecks: &[Duration],
    now: DateTime<Utc>,
) -> Next {
    match verdict {
        ActionAnswer::Cancelled => Next::Ack(Outcome::Cancelled),
        ActionAnswer::NotUnpaid => Next::Ack(Outcome::NotUnpaid),
        ActionAnswer::Extended => Next::Ack(Outcome::Extended),
        ActionAnswer::Unknown => match rechecks.get(message.unknown_rechecks as usize) {
            Some(after) => {
                let mut next = message.again_at(now + *after);
                next.unknown_rechecks = message.unknown_rechecks.saturating_add(1);
                Next::Requeue(next, Outcome::UnknownRequeued)
            }
            None => Next::Ack(Outcome::Unknown),
        },
        ActionAnswer::Retry(reason) => Next::Retry(reason),
        ActionAnswer::Park(reason) => Next::Park(reason),
        ActionAnswer::NotDue { clock, left } => Next::Hold(clock, left),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Settings;
    use crate::publisher::OrderId;

    fn at(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + s, 0).unwrap()
    }

    fn message(check_step: u32, unknown_rechecks: u32) -> ExpiryMessage {
        let mut m = ExpiryMessage::new(OrderId::new("o-1").unwrap(), at(0));
        m.check_step = check_step;
        m.unknown_rechecks = unknown_rechecks;
        m
    }

    fn check(final_outcome: FinalOutcome) -> CheckSettings {
        let mut check = Settings::default().action.check;
        check.steps = vec![Duration::from_secs(1), Duration::from_secs(3)];
        check.final_outcome = final_outcome;
        check
    }

    fn pending() -> Checked {
        Checked::Answer(CheckAnswer::Pending)
    }

    fn requeued(next: Next) -> (ExpiryMessage, Outcome) {
        match next {
            Next::Requeue(message, outcome) => (message, outcome),
            other => panic!("requeued, not {other:?}"),
        }
    }

    #[test]
    fn pending_goes_to_the_next_step_at_its_time() {
        let settings = check(FinalOutcome::Park);
        let step = |m: &ExpiryMessage| match after_check(pending(), m, &settings, at(10)) {
            AfterCheck::Then(next) => requeued(next),
            AfterCheck::Act => panic!("requeued, not acted on"),
        };
        let (first, outcome) = step(&message(0, 0));
        assert_eq!(outcome, Outcome::CheckRequeued);
        assert_eq!((first.check_step, first.not_before), (1, Some(at(11))));
        assert_eq!(first.due_at, at(0), "the deadline stays");
        let (second, _) = step(&first);
        assert_eq!((second.check_step, second.not_before), (2, Some(at(13))));
    }

    #[test]
    fn after_the_last_step_the_final_outcome_applies() {
        let last = message(2, 0);
        let decide = |m: &ExpiryMessage, final_outcome| {
            after_check(pending(), m, &check(final_outcome), at(10))
        };
        assert!(matches!(
            decide(&last, FinalOutcome::Park),
            AfterCheck::Then(Next::Park(reason)) if reason.contains("after 3 checks")
        ));
        let keep = AfterCheck::Then(Next::Ack(Outcome::PendingAtGateway));
        assert_eq!(decide(&last, FinalOutcome::Cancel), AfterCheck::Act);
        assert_eq!(decide(&last, FinalOutcome::Keep), keep);
        // A step beyond the list (the list was shortened): the final outcome.
        assert_eq!(decide(&message(9, 0), FinalOutcome::Keep), keep);
    }

    #[test]
    fn paid_unpaid_and_failed_checks() {
        let settings = check(FinalOutcome::Park);
        #[rustfmt::skip]
        let cases = [
            (Checked::Answer(CheckAnswer::Paid), AfterCheck::Then(Next::Ack(Outcome::PaidAtGateway))),
            (Checked::Answer(CheckAnswer::Unpaid), AfterCheck::Act),
            (Checked::Retry("503".into()), AfterCheck::Then(Next::Retry("503".into()))),
            (Checked::Park("400".into()), AfterCheck::Then(Next::Park("400".into()))),
        ];
        let first = message(0, 0);
        for (checked, want) in cases {
            assert_eq!(after_check(checked, &first, &settings, at(10)), want);
        }
    }

    #[test]
    fn an_unknown_order_is_looked_for_again_a_bounded_number_of_times() {
        let rechecks = [Duration::from_secs(1), Duration::from_secs(4)];
        let unknown =
            |m: &ExpiryMessage, now| after_action(ActionAnswer::Unknown, m, &rechecks, now);
        let rechecked = |m: &ExpiryMessage| (m.unknown_rechecks, m.not_before);
        let (first, outcome) = requeued(unknown(&message(0, 0), at(10)));
        assert_eq!(outcome, Outcome::UnknownRequeued);
        assert_eq!(rechecked(&first), (1, Some(at(11))));
        let (second, _) = requeued(unknown(&first, at(11)));
        assert_eq!(rechecked(&second), (2, Some(at(15))));
        assert_eq!(unknown(&second, at(15)), Next::Ack(Outcome::Unknown));
        assert_eq!(
            after_action(ActionAnswer::Unknown, &message(0, 0), &[], at(10)),
            Next::Ack(Outcome::Unknown)
        );
    }

    #[test]
    fn other_verdicts_map_one_to_one() {
        let not_due = ActionAnswer::NotDue {
            clock: "database",
            left: Duration::from_millis(7),
        };
        for (verdict, next) in [
            (ActionAnswer::Cancelled, Next::Ack(Outcome::Cancelled)),
            (ActionAnswer::NotUnpaid, Next::Ack(Outcome::NotUnpaid)),
            (ActionAnswer::Extended, Next::Ack(Outcome::Extended)),
            (ActionAnswer::Retry("r".into()), Next::Retry("r".into())),
            (ActionAnswer::Park("p".into()), Next::Park("p".into())),
            (not_due, Next::Hold("database", Duration::from_millis(7))),
        ] {
            assert_eq!(after_action(verdict, &message(0, 0), &[], at(0)), next);
        }
    }
}
