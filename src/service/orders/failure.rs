//! What a database failure means for the messages of the statement that hit it,
//! decided from the SQLSTATE alone. Pure: the table test below is the contract.
//!
//! The consumer splits a batch that failed with [`FailureClass::Permanent`] or
//! [`FailureClass::Transient`] until the order at fault is alone, so one bad or
//! busy order never holds the others; a lone one is parked (permanent) or retried
//! on its own timer (transient). [`FailureClass::Unavailable`] means no statement
//! can succeed now, whatever its orders: splitting would only multiply the
//! failures, so the whole set waits on one backoff and intake pauses.

/// How the consumer treats the messages of a failed statement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureClass {
    /// The database rejected these orders' data or the statement for them (data,
    /// integrity or SQL errors): retrying the same order fails again. A lone
    /// message is parked with the SQLSTATE and the server's message.
    Permanent,
    /// The database answered, but could not do it this time (a lock, a
    /// serialization failure or deadlock, the statement timeout): split, and a
    /// lone message retries on its own backoff.
    Transient,
    /// Nothing can succeed now: the database is unreachable, shutting down,
    /// read-only (a standby, a demoted primary), out of resources, did not
    /// answer in time, or the configured statement itself is broken. Every
    /// message waits on one backoff; intake pauses.
    Unavailable,
}

/// The class of a server error with SQLSTATE `code` (five characters).
/// Unknown codes are [`FailureClass::Transient`]: retried, never parked.
pub fn classify(code: &str) -> FailureClass {
    use FailureClass::{Permanent, Transient, Unavailable};
    match code {
        // Revoked privileges fail every order alike: an operator's fix, not the data's.
        "42501" => Unavailable,
        // Statement timeout, lock not available, object in use.
        "57014" | "55P03" | "55006" => Transient,
        // Admin, crash or cannot-connect-now shutdown; database dropped.
        "57P01" | "57P02" | "57P03" | "57P04" | "57P05" => Unavailable,
        // Read-only SQL transaction: the connection reaches a standby, or a
        // primary that was demoted or fenced read-only. No order can be
        // cancelled through it; the store drops it, and a new connection
        // finds the writable server (`target_session_attrs=read-write`).
        "25006" => Unavailable,
        // Serialization failure, deadlock, statement completion unknown.
        "40001" | "40P01" | "40003" => Transient,
        // Deferred constraint violated at commit.
        "40002" => Permanent,
        _ => match code.get(..2) {
            // Connection exception; insufficient resources; system (I/O) error;
            // invalid authorization.
            Some("08" | "53" | "58" | "28") => Unavailable,
            // Data exception, syntax or access rule, integrity constraint,
            // SQL routine, feature not supported, cardinality, dependent
            // privilege, triggered data change, WITH CHECK OPTION, program
            // limit, PL/pgSQL (RAISE in a trigger), external routine.
            Some(
                "22" | "42" | "23" | "2F" | "0A" | "21" | "2B" | "27" | "44" | "54" | "P0" | "38"
                | "39",
            ) => Permanent,
            _ => Transient,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::FailureClass::*;
    use super::*;

    #[test]
    fn every_listed_sqlstate_has_its_class() {
        let table = [
            // Permanent: the data or the SQL for these orders.
            ("22P02", Permanent, "invalid text representation (uuid)"),
            ("22001", Permanent, "string data right truncation"),
            ("22012", Permanent, "division by zero"),
            ("23514", Permanent, "check violation"),
            ("23505", Permanent, "unique violation"),
            ("42883", Permanent, "undefined function at run time"),
            ("42804", Permanent, "datatype mismatch"),
            ("2F005", Permanent, "function executed no return statement"),
            ("0A000", Permanent, "feature not supported"),
            ("21000", Permanent, "cardinality violation"),
            ("27000", Permanent, "triggered data change violation"),
            ("44000", Permanent, "with check option violation"),
            ("54000", Permanent, "program limit exceeded"),
            ("P0001", Permanent, "RAISE EXCEPTION in a trigger"),
            ("40002", Permanent, "deferred constraint at commit"),
            // Transient: the database answered, not this time.
            ("55P03", Transient, "lock not available (lock_timeout)"),
            ("55006", Transient, "object in use"),
            ("57014", Transient, "statement timeout"),
            ("40001", Transient, "serialization failure"),
            ("40P01", Transient, "deadlock"),
            ("40003", Transient, "statement completion unknown"),
            ("XX000", Transient, "internal error: unknown, retried"),
            ("99999", Transient, "unknown code"),
            ("", Transient, "no code"),
            // Unavailable: nothing can succeed now.
            ("08006", Unavailable, "connection failure"),
            ("08001", Unavailable, "cannot establish connection"),
            ("53300", Unavailable, "too many connections"),
            ("53100", Unavailable, "disk full"),
            ("53200", Unavailable, "out of memory"),
            ("57P01", Unavailable, "admin shutdown"),
            ("57P02", Unavailable, "crash shutdown"),
            ("57P03", Unavailable, "cannot connect now"),
            ("58030", Unavailable, "I/O error"),
            ("28P01", Unavailable, "invalid password"),
            ("42501", Unavailable, "insufficient privilege"),
            ("25006", Unavailable, "read-only transaction (a standby)"),
            ("25001", Transient, "active SQL transaction: other 25xxx"),
        ];
        for (code, class, what) in table {
            assert_eq!(classify(code), class, "{code} ({what})");
        }
    }
}
