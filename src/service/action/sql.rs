//! The SQL action: every [`OrderStore`] expires orders with its atomic cancel
//! statement. A row locked by a payment is retried alone; the rest settles.

use super::{Action, ActionAnswer, ActionError, Expiring};
use crate::clock::Clock;
use crate::publisher::ExpiryMessage;
use crate::service::orders::{Disposition, OrderStore};

impl<S: OrderStore> Action for S {
    async fn expire(&self, due: &[Expiring<'_>]) -> Result<Vec<ActionAnswer>, ActionError> {
        let messages: Vec<&ExpiryMessage> = due.iter().map(|e| e.message).collect();
        let dispositions = self.cancel_unpaid(&messages).await?;
        Ok(dispositions.into_iter().map(verdict).collect())
    }

    fn clock(&self) -> Clock {
        OrderStore::clock(self)
    }
}

fn verdict(disposition: Disposition) -> ActionAnswer {
    match disposition {
        Disposition::Cancelled => ActionAnswer::Cancelled,
        Disposition::NotUnpaid => ActionAnswer::NotUnpaid,
        Disposition::Unknown => ActionAnswer::Unknown,
        Disposition::Extended => ActionAnswer::Extended,
        Disposition::Busy => ActionAnswer::Retry("order locked by another transaction".into()),
        Disposition::NotDue(left) => ActionAnswer::NotDue {
            clock: "database",
            left,
        },
    }
}
