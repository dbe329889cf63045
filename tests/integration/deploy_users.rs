//! The compose broker's users file (`deploy/rabbitmq/20-dev-users.json`) gives
//! each user the password its documented URL uses. Only the broker knows its
//! hashing, so the real one says: the users are imported under fresh names and
//! `rabbitmqctl authenticate_user` tries each URL's password. (The offline
//! `scripts/check-deploy` checks the file's shape and the import order.)

use std::collections::HashMap;

use order_expiry_testkit::{Imported, try_rabbitmqctl};
use serde_json::Value;

use crate::docs::repo_file;

/// user → password of every `amqp://user:password@` URL in `text`.
fn url_passwords(text: &str) -> HashMap<String, String> {
    text.split("amqp://")
        .skip(1)
        .filter_map(|rest| {
            let userinfo = rest.split('@').next()?;
            let (user, password) = userinfo.split_once(':')?;
            let plain = |s: &str| {
                s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
            };
            (plain(user) && plain(password)).then(|| (user.to_owned(), password.to_owned()))
        })
        .collect()
}

#[test]
fn the_dev_users_file_holds_the_documented_passwords() {
    let mut passwords = url_passwords(&repo_file("docker-compose.yml"));
    passwords.extend(url_passwords(&repo_file("docs/src/operating/deploy.md")));
    let file: Value =
        serde_json::from_str(&repo_file("deploy/rabbitmq/20-dev-users.json")).unwrap();
    let suffix = &uuid::Uuid::new_v4().simple().to_string()[..8];
    let mut users = file["users"].as_array().unwrap().clone();
    for user in &mut users {
        user["name"] = format!("{}-{suffix}", user["name"].as_str().unwrap()).into();
    }
    let _imported = Imported::new(&serde_json::json!({ "users": users }));

    for name in users.iter().filter_map(|u| u["name"].as_str()) {
        let documented = name.strip_suffix(&format!("-{suffix}")).unwrap();
        let password = passwords.get(documented).unwrap_or_else(|| {
            panic!("no URL in docker-compose.yml or docs/src/operating/deploy.md uses {documented}")
        });
        let refused = format!("{documented}: the broker refuses the documented password");
        let authenticated = try_rabbitmqctl(&["-q", "authenticate_user", name, password]);
        authenticated.unwrap_or_else(|e| panic!("{refused}: {e}"));
    }
}
