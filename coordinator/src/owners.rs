//! Which node each agent and attempt belongs to, as the store said once: neither ever
//! changes, so an agent token's requests are checked against their node without a store
//! read each (a claim, a heartbeat, a start and an end would read it every time).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::store::NodeOf;

/// Entries kept at most; past it the map starts afresh (the next requests read once more).
/// An attempt's entry goes when it ends, so the map holds about the live attempts and the
/// agents.
const CAP: usize = 1 << 16;

/// The nodes looked up so far, shared by a replica's requests.
#[derive(Clone, Default)]
pub struct Owners(Arc<Mutex<HashMap<NodeOf, Arc<str>>>>);

impl Owners {
    /// The node `of` belongs to, if looked up before.
    pub fn get(&self, of: NodeOf) -> Option<Arc<str>> {
        self.map().get(&of).cloned()
    }

    /// Keeps `node` as the owner of `of`.
    pub fn remember(&self, of: NodeOf, node: &str) {
        let mut map = self.map();
        if map.len() >= CAP {
            map.clear();
        }
        map.insert(of, node.into());
    }

    /// Forgets `of` (an attempt that ended: its reports are over).
    pub fn forget(&self, of: NodeOf) {
        self.map().remove(&of);
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<NodeOf, Arc<str>>> {
        // Every write leaves the map whole, so a panic elsewhere leaves nothing half-done.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use headroom_shared::{AgentId, AttemptId};

    #[test]
    fn owners_are_kept_forgotten_and_bounded() {
        let owners = Owners::default();
        let (agent, attempt) = (AgentId::new(), AttemptId::new());
        owners.remember(NodeOf::Agent(agent), "n1");
        owners.remember(NodeOf::Attempt(attempt), "n1");
        assert_eq!(owners.get(NodeOf::Agent(agent)).as_deref(), Some("n1"));
        assert_eq!(owners.get(NodeOf::Attempt(AttemptId::new())), None);
        owners.forget(NodeOf::Attempt(attempt));
        assert_eq!(owners.get(NodeOf::Attempt(attempt)), None);
        for _ in 0..CAP + 10 {
            owners.remember(NodeOf::Attempt(AttemptId::new()), "n2");
        }
        let kept = owners.map().len();
        assert!(kept <= CAP, "{kept} entries");
    }
}
