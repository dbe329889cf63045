//! The SQL action: every [`OrderStore`] expires orders with its atomic cancel
//! statement. A row locked by a payment is retried alone; the rest settles.

use super::{Action, ActionError, Expiring, Verdict};
use crate::publisher::ExpiryMessage;
use crate::service::orders::{Disposition, OrderStore};

impl<S: OrderStore> Action for S {
    async fn expire(&self, due: &[Expiring<'_>]) -> Result<Vec<Verdict>, ActionError> {
        let messages: Vec<&ExpiryMessage> = due.iter().map(|e| e.message).collect();
        let dispositions = self.cancel_unpaid(&messages).await?;
        Ok(dispositions.into_iter().map(verdict).collect())
    }
}

fn verdict(disposition: Disposition) -> Verdict {
    match disposition {
        Disposition::Cancelled => Verdict::Cancelled,
        Disposition::NotUnpaid => Verdict::NotUnpaid,
        Disposition::Unknown => Verdict::Unknown,
        Disposition::Extended => Verdict::Extended,
        Disposition::Busy => Verdict::Retry("order locked by another transaction".into()),
    }
}
