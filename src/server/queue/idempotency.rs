//! Idempotent creates: a create that carries a key is answered, for a day,
//! with the answer to the first create with that key, so that a client that
//! lost the answer to a committed batch can retry it without duplicating
//! it. The key, a fingerprint of the request and the ids created are written
//! in the same transaction as the jobs. The same key with a different
//! request is refused, as Stripe does.

use std::time::Duration;

use super::{Queue, rules};
use crate::protocol::{CreateJob, JobError, JobId};

/// How long a key's answer is kept.
pub const KEY_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// The longest key accepted, in bytes.
pub const MAX_KEY_BYTES: usize = 255;

/// Checks a key given by a client.
pub fn check_key(key: &str) -> Result<(), JobError> {
    if key.is_empty() || key.len() > MAX_KEY_BYTES || key.chars().any(char::is_control) {
        return Err(JobError::Malformed("idempotencyKey"));
    }
    Ok(())
}

/// A fingerprint of the creates: FNV-1a (64 bits) of their description.
/// It only tells one request from another; it is not a secret.
fn fingerprint(cmds: &[CreateJob]) -> String {
    let text = format!("{cmds:?}");
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in text.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{hash:016x}:{}", cmds.len())
}

impl Queue {
    /// CreateJobs, idempotently when `key` is given (see
    /// [`Queue::create_idempotent`]).
    pub async fn create_with_key(
        &self,
        key: Option<String>,
        cmds: Vec<CreateJob>,
    ) -> Result<Vec<JobId>, JobError> {
        match key {
            Some(key) => self.create_idempotent(key, cmds).await,
            None => self.create_many(cmds).await,
        }
    }

    /// CreateJob(s) with an idempotency key: the first request with `key`
    /// creates the jobs; a repeat within [`KEY_TTL`] gets the same ids and
    /// creates nothing; the same key with different jobs is refused.
    pub async fn create_idempotent(
        &self,
        key: String,
        cmds: Vec<CreateJob>,
    ) -> Result<Vec<JobId>, JobError> {
        check_key(&key)?;
        let fingerprint = fingerprint(&cmds);
        let ttl = KEY_TTL.as_millis() as i64;
        self.write(move |tx| {
            let now = tx.now;
            let since = now.plus_millis(-ttl);
            if let Some((first, ids)) = tx.store().idempotent_answer(&key, since)? {
                return if first == fingerprint {
                    Ok(ids)
                } else {
                    Err(JobError::IdempotencyKeyReused(key.clone()))
                };
            }
            let ids = cmds
                .iter()
                .map(|cmd| rules::create(tx, cmd))
                .collect::<Result<Vec<_>, _>>()?;
            tx.store()
                .remember_answer(&key, &fingerprint, &ids, now, since)?;
            Ok(ids)
        })
        .await
    }
}
