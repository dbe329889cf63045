//! The RabbitMQ definitions ops import (`order-expiry topology export`, the
//! repository's `definitions.json`): the [`Topology`] in a vhost of its own plus
//! the least-privilege users of [`super::access`], in the format
//! `rabbitmqctl import_definitions` and `load_definitions` read.

use serde_json::{Map, Value, json};

use super::access::{Access, exactly};
use super::describe::{Arg, Binding, Destination, Exchange, ExchangeType, Queue, Topology};
use super::ladder::Ladder;
use crate::settings::TopologySettings;

/// The definitions `topology export` prints for `settings`: every exchange, queue
/// and binding, and the publisher and consumer users with their permissions, all
/// in `vhost`; pretty-printed with a trailing newline, the bytes of
/// `definitions.json` for the default settings. `event_exchange` is the event
/// action's exchange (`action.amqp.exchange` with `action.kind = amqp`), which
/// the consumer user may then write to; `None` with the other actions.
pub fn definitions_json(
    ladder: &Ladder,
    settings: &TopologySettings,
    vhost: &str,
    event_exchange: Option<&str>,
) -> String {
    let mut definitions = objects(&Topology::describe(ladder, settings), vhost);
    definitions["policies"] = json!([redelivery_policy(ladder, vhost)]);
    Access::describe(ladder, event_exchange).add_to(&mut definitions, vhost);
    let mut text =
        serde_json::to_string_pretty(&definitions).unwrap_or_else(|_| String::from("{}"));
    text.push('\n');
    text
}

/// The vhost and every object of `topology` in it.
fn objects(topology: &Topology, vhost: &str) -> Value {
    json!({
        "vhosts": [{ "name": vhost }],
        "exchanges": topology.exchanges.iter().map(|e| exchange(e, vhost)).collect::<Vec<_>>(),
        "queues": topology.queues.iter().map(|q| queue(q, vhost)).collect::<Vec<_>>(),
        "bindings": topology.bindings.iter().map(|b| binding(b, vhost)).collect::<Vec<_>>(),
    })
}

/// Quorum queues on RabbitMQ 4.0 drop a message returned more than 20 times
/// (the default `delivery-limit`). The due queue returns held messages on
/// every consumer restart, and `status` and `parked list` read the parked
/// queue by returning what they looked at; so both queues get a limit no one
/// reaches. A policy, not a queue argument: it also reaches queues declared
/// before it, which a different argument would make the broker refuse to
/// re-declare. (`apply-to: queues`: 3.10 knows no `quorum_queues`; classic
/// queues ignore the key.)
fn redelivery_policy(ladder: &Ladder, vhost: &str) -> Value {
    json!({
        "vhost": vhost,
        "name": format!("{}.delivery-limit", ladder.prefix()),
        "pattern": exactly(&[ladder.due_queue(), ladder.parked_queue()]),
        "apply-to": "queues",
        "priority": 0,
        "definition": { "delivery-limit": 1_000_000_000 },
    })
}

fn exchange(e: &Exchange, vhost: &str) -> Value {
    let kind = match e.kind {
        ExchangeType::Topic => "topic",
        ExchangeType::Fanout => "fanout",
    };
    json!({
        "name": e.name,
        "vhost": vhost,
        "type": kind,
        "durable": true,
        "auto_delete": false,
        "internal": false,
        "arguments": {},
    })
}

fn queue(q: &Queue, vhost: &str) -> Value {
    let arguments: Map<String, Value> = q
        .arguments
        .iter()
        .map(|(k, v)| {
            let v = match v {
                Arg::Str(s) => json!(s),
                Arg::Int(i) => json!(i),
            };
            (k.clone(), v)
        })
        .collect();
    json!({
        "name": q.name,
        "vhost": vhost,
        "durable": true,
        "auto_delete": false,
        "arguments": arguments,
    })
}

fn binding(b: &Binding, vhost: &str) -> Value {
    let destination_type = match b.destination_type {
        Destination::Queue => "queue",
        Destination::Exchange => "exchange",
    };
    json!({
        "source": b.source,
        "vhost": vhost,
        "destination": b.destination,
        "destination_type": destination_type,
        "routing_key": b.routing_key,
        "arguments": {},
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Settings;

    fn list<'a>(defs: &'a Value, key: &str) -> &'a Vec<Value> {
        defs[key].as_array().unwrap()
    }

    #[test]
    fn definitions_name_every_object_in_the_vhost() {
        let settings = TopologySettings {
            levels: 4,
            ..Settings::default().topology
        };
        let ladder = Ladder::new("orders", 4).unwrap();
        let defs = objects(&Topology::describe(&ladder, &settings), "vh");
        // The levels; due, parked and catch-up.
        assert_eq!(list(&defs, "queues").len(), 4 + 3);
        assert_eq!(list(&defs, "exchanges").len(), 4 + 3);
        assert_eq!(list(&defs, "bindings").len(), 4 * 2 + 3);
        let in_vh = |q: &Value| q["vhost"] == "vh" && q["durable"] == true;
        assert!(list(&defs, "queues").iter().all(in_vh));
    }

    #[test]
    fn the_export_names_its_vhost_and_passwordless_users() {
        let s = Settings::default();
        let text = definitions_json(&s.ladder().unwrap(), &s.topology, &s.topology.vhost, None);
        let defs: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(defs["vhosts"], json!([{ "name": "order-expiry" }]));
        let users = list(&defs, "users");
        assert_eq!(users.len(), 2);
        assert!(users.iter().all(|u| u["password_hash"] == ""));
        let mut permissions = list(&defs, "permissions")
            .iter()
            .chain(list(&defs, "topic_permissions"));
        assert!(permissions.all(|p| p["vhost"] == "order-expiry"));
        assert!(!text.contains("guest"), "guest is not in the definitions");
    }
}
