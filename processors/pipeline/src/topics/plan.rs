//! The difference between the declared topics and the cluster: what `apply` changes and
//! what it only reports. Pure, so the rules are unit-tested.

use super::{ActualTopic, Change, Drift, TopicSpec};
use std::collections::BTreeMap;

/// What `apply` would do, and what it cannot fix.
pub fn plan(
    desired: &[TopicSpec],
    actual: &BTreeMap<String, ActualTopic>,
) -> (Vec<Change>, Vec<Drift>) {
    let mut changes = Vec::new();
    let mut drift = Vec::new();
    for spec in desired {
        let Some(have) = actual.get(&spec.name) else {
            changes.push(Change::Create(spec.clone()));
            continue;
        };
        if have.partitions < spec.partitions {
            changes.push(Change::AddPartitions {
                topic: spec.name.clone(),
                from: have.partitions,
                to: spec.partitions,
            });
        } else if have.partitions > spec.partitions {
            drift.push(Drift::MorePartitions {
                topic: spec.name.clone(),
                declared: spec.partitions,
                actual: have.partitions,
            });
        }
        if have.replication_factor != spec.replication_factor {
            drift.push(Drift::ReplicationFactor {
                topic: spec.name.clone(),
                declared: spec.replication_factor,
                actual: have.replication_factor,
            });
        }
        for (key, value) in &spec.config {
            let current = have.config.get(key);
            if current != Some(value) {
                changes.push(Change::SetConfig {
                    topic: spec.name.clone(),
                    key: key.clone(),
                    from: current.cloned(),
                    to: value.clone(),
                });
            }
        }
    }
    (changes, drift)
}
