//! `stocksvr acls print`: the least-privilege Kafka ACLs of each role of a deployment, for
//! its `kafka.topic_namespace` and `kafka.group_prefix`, as `kafka-acls` commands (the form
//! `scripts/stack acls apply` reads).
//!
//! With a namespace every topic of the deployment starts with `<namespace>.`, so one
//! prefixed ACL per operation covers them all, topics added later included; without one,
//! each declared topic and its `.dlt` gets a literal ACL. Groups are always by prefix
//! (`<group_prefix>.`): every group of the service is `<group_prefix>.<processor>`, the lag
//! exporter's reader included. Read, Write, Alter and the like imply Describe, so no
//! Describe is listed where one of them is. No cluster ACL: an idempotent producer needs
//! only Write on a topic since Kafka 2.8 (KIP-679), and listing groups returns the groups a
//! principal may Describe.

use stocksvr_pipeline::config::KafkaSettings;

/// Who connects to Kafka, and with which principal by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Role {
    /// The service (`stocksvr all` and each processor alone, dead-letter replay, `stocksvr
    /// produce`, `stocksvr offsets`): reads and writes the deployment's topics, joins and
    /// commits as its groups.
    Stocksvr,
    /// `stocksvr topics apply|describe`: creates topics, adds partitions, reads and alters
    /// their configs. Nothing else, and not the service's principal.
    Admin,
    /// A lag exporter with a principal of its own (`stocksvr lag-exporter`): describes the
    /// groups and reads one record per lagging partition (the lag in seconds).
    Lag,
    /// An order service producing the order events stocksvr consumes.
    OrderService,
    /// Every role above.
    All,
}

impl Role {
    const EACH: [Role; 4] = [Role::Stocksvr, Role::Admin, Role::Lag, Role::OrderService];

    /// The SASL user (or certificate name) of the role on the secure local stack.
    pub const fn default_principal(self) -> &'static str {
        match self {
            Role::Stocksvr | Role::All => "stocksvr",
            Role::Admin => "stocksvr-admin",
            Role::Lag => "stocksvr-lag",
            Role::OrderService => "order-service",
        }
    }

    const fn why(self) -> &'static str {
        match self {
            Role::Stocksvr => "the service: consumes and produces the deployment's topics (dead letters and replays too), joins and commits as <group_prefix>.<processor>; the lag exporter inside `stocksvr all` reads as <group_prefix>.lag-exporter-reader",
            Role::Admin => "`stocksvr topics apply|describe`: CreateTopics, CreatePartitions (Alter), DescribeConfigs, AlterConfigs on the deployment's topics only",
            Role::Lag => "a lag exporter of its own: lists and describes the groups (committed offsets), reads the watermarks and one record per lagging partition (Fetch needs Read)",
            Role::OrderService => "an order service: writes the order events, nothing else",
            Role::All => "",
        }
    }
}

/// One ACL line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acl {
    pub principal: String,
    /// `Read`, `Write`, `Create`, ... as `kafka-acls --operation` takes them.
    pub operation: &'static str,
    /// `topic` or `group`.
    pub resource: &'static str,
    pub name: String,
    pub prefixed: bool,
}

impl Acl {
    /// The `kafka-acls` command that adds it.
    pub fn command(&self, brokers: &str) -> String {
        format!(
            "kafka-acls --bootstrap-server {brokers} --command-config admin.properties --add --allow-principal User:{} --operation {} --{} {} --resource-pattern-type {}",
            self.principal,
            self.operation,
            self.resource,
            self.name,
            if self.prefixed { "prefixed" } else { "literal" }
        )
    }
}

/// The deployment's topics as ACL resources: `(name, prefixed)`.
fn topic_resources(kafka: &KafkaSettings) -> anyhow::Result<Vec<(String, bool)>> {
    if !kafka.topic_namespace.is_empty() {
        return Ok(vec![(format!("{}.", kafka.topic_namespace), true)]);
    }
    let specs = stocksvr_pipeline::topics::for_deployment(kafka)?;
    Ok(specs.into_iter().map(|s| (s.name, false)).collect())
}

/// The ACLs `role` needs in this deployment, for `principal` (the role's default when
/// `None`).
pub fn for_role(
    role: Role,
    kafka: &KafkaSettings,
    principal: Option<&str>,
) -> anyhow::Result<Vec<Acl>> {
    if role == Role::All {
        let mut all = Vec::new();
        for each in Role::EACH {
            all.extend(for_role(each, kafka, None)?);
        }
        return Ok(all);
    }
    let principal = principal.unwrap_or(role.default_principal()).to_string();
    let topics = topic_resources(kafka)?;
    let groups = format!("{}.", kafka.group_prefix);
    let acl = |operation, resource, name: &str, prefixed| Acl {
        principal: principal.clone(),
        operation,
        resource,
        name: name.to_string(),
        prefixed,
    };
    let mut out = Vec::new();
    let on_topics = |ops: &[&'static str], out: &mut Vec<Acl>| {
        for (name, prefixed) in &topics {
            for op in ops {
                out.push(acl(op, "topic", name, *prefixed));
            }
        }
    };
    match role {
        Role::Stocksvr => {
            on_topics(&["Read", "Write"], &mut out);
            out.push(acl("Read", "group", &groups, true));
        }
        Role::Admin => on_topics(
            &["Create", "Alter", "DescribeConfigs", "AlterConfigs"],
            &mut out,
        ),
        Role::Lag => {
            out.push(acl("Describe", "group", &groups, true));
            on_topics(&["Read"], &mut out);
        }
        Role::OrderService => {
            let topic = kafka.topic("order.lifecycle.v1");
            out.push(acl("Write", "topic", &topic, false));
        }
        Role::All => {}
    }
    Ok(out)
}

/// The text `stocksvr acls print` writes: a comment per role, then its commands.
pub fn print(role: Role, kafka: &KafkaSettings, principal: Option<&str>) -> anyhow::Result<String> {
    let roles: Vec<Role> = if role == Role::All {
        Role::EACH.to_vec()
    } else {
        vec![role]
    };
    let namespace = if kafka.topic_namespace.is_empty() {
        "(none: one literal ACL per topic)".to_string()
    } else {
        kafka.topic_namespace.clone()
    };
    let mut text = format!(
        "# Least-privilege Kafka ACLs of stocksvr for topic namespace {namespace} and group prefix {}.\n# admin.properties: the client settings of a principal allowed to alter ACLs.\n",
        kafka.group_prefix
    );
    for each in roles {
        let principal = if role == Role::All { None } else { principal };
        text.push_str(&format!(
            "# {}: {}\n",
            principal.unwrap_or(each.default_principal()),
            each.why()
        ));
        for acl in for_role(each, kafka, principal)? {
            text.push_str(&acl.command(&kafka.brokers));
            text.push('\n');
        }
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kafka(namespace: &str) -> KafkaSettings {
        KafkaSettings {
            topic_namespace: namespace.into(),
            group_prefix: "svc".into(),
            brokers: "k:9094".into(),
            topics_file: concat!(env!("CARGO_MANIFEST_DIR"), "/../../topics.yaml").into(),
            ..KafkaSettings::default()
        }
    }

    #[test]
    fn a_namespace_is_covered_by_prefixed_acls() {
        let acls = for_role(Role::Stocksvr, &kafka("demo"), None).expect("acls");
        let lines: Vec<String> = acls.iter().map(|a| a.command("b")).collect();
        assert_eq!(
            lines,
            [
                "kafka-acls --bootstrap-server b --command-config admin.properties --add --allow-principal User:stocksvr --operation Read --topic demo. --resource-pattern-type prefixed",
                "kafka-acls --bootstrap-server b --command-config admin.properties --add --allow-principal User:stocksvr --operation Write --topic demo. --resource-pattern-type prefixed",
                "kafka-acls --bootstrap-server b --command-config admin.properties --add --allow-principal User:stocksvr --operation Read --group svc. --resource-pattern-type prefixed",
            ]
        );
        let order = for_role(Role::OrderService, &kafka("demo"), Some("orders")).expect("acls");
        assert_eq!(order.len(), 1);
        assert_eq!(order[0].name, "demo.order.lifecycle.v1");
        assert_eq!(order[0].principal, "orders");
        assert!(!order[0].prefixed);
    }

    #[test]
    fn without_a_namespace_each_topic_and_its_dead_letters_get_a_literal_acl() {
        let acls = for_role(Role::Admin, &kafka(""), None).expect("acls");
        let topics: std::collections::BTreeSet<&str> =
            acls.iter().map(|a| a.name.as_str()).collect();
        assert!(topics.contains("order.lifecycle.v1"), "{topics:?}");
        assert!(topics.contains("order.lifecycle.v1.dlt"), "{topics:?}");
        assert!(acls.iter().all(|a| !a.prefixed && a.resource == "topic"));
        assert_eq!(acls.len(), topics.len() * 4, "four operations per topic");
    }

    #[test]
    fn all_roles_print_under_their_own_principals() {
        let text = print(Role::All, &kafka("demo"), None).expect("text");
        for user in [
            "stocksvr",
            "stocksvr-admin",
            "stocksvr-lag",
            "order-service",
        ] {
            assert!(
                text.contains(&format!("--allow-principal User:{user} ")),
                "{user}: {text}"
            );
        }
        assert!(text
            .lines()
            .all(|l| l.starts_with("# ") || l.starts_with("kafka-acls ")));
    }

    #[test]
    fn the_example_file_is_what_print_prints_for_the_demo() {
        // stack/kafka/acls.example is what the secure stack's smoke check applies without a
        // built binary, and what the docs show: it must not drift from the code.
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../stack/kafka/acls.example"
        );
        let file = std::fs::read_to_string(path).expect("stack/kafka/acls.example");
        let listed: String = file
            .lines()
            .filter(|l| !l.starts_with("## "))
            .map(|l| format!("{l}\n"))
            .collect();
        let demo = KafkaSettings {
            brokers: "<b>".into(),
            group_prefix: KafkaSettings::default().group_prefix,
            ..kafka("demo")
        };
        assert_eq!(
            listed,
            print(Role::All, &demo, None).expect("text"),
            "stack/kafka/acls.example: print it again with \
             STOCKSVR__KAFKA__TOPIC_NAMESPACE=demo STOCKSVR__KAFKA__BROKERS='<b>' stocksvr acls print --role all"
        );
    }
}
