//! Keeps `docker-compose.yml` what Redlock needs (five independent, durable,
//! non-evicting masters) and in sync with the node list in `README.md`.
//! Needs no Redis and no YAML crate: the compose file is simple enough for a
//! line-based reader, and a construct it does not understand fails the test
//! rather than passing it.

use std::collections::BTreeMap;
use std::path::Path;

const NODES: usize = 5;
const HOST_PORTS: [u16; NODES] = [7001, 7002, 7003, 7004, 7005];
const CONTAINER_PORT: u16 = 6379;
/// Flags every node must run with, as `--flag value` pairs.
const REQUIRED_FLAGS: [(&str, &str); 3] = [
    ("--appendonly", "yes"),
    ("--appendfsync", "always"),
    ("--maxmemory-policy", "noeviction"),
];

#[test]
fn compose_runs_five_independent_durable_masters() {
    let text = read("docker-compose.yml");
    let services = parse_services(&text);
    assert_eq!(
        services.len(),
        NODES,
        "docker-compose.yml: expected {NODES} services, found {:?}",
        services.keys().collect::<Vec<_>>()
    );
    for (name, service) in &services {
        let image = service.scalar("image").unwrap_or_default();
        assert!(
            image.starts_with("redis:7"),
            "service {name}: image {image:?} is not redis:7"
        );
        let command = service.words("command");
        for (flag, value) in REQUIRED_FLAGS {
            let found = command
                .windows(2)
                .any(|pair| pair[0] == flag && pair[1] == value);
            assert!(
                found,
                "service {name}: command {command:?} lacks `{flag} {value}`"
            );
        }
        let ports = service.list("ports");
        assert_eq!(
            ports.len(),
            1,
            "service {name}: expected one port mapping, found {ports:?}"
        );
        let mapping = parse_port(&ports[0])
            .unwrap_or_else(|| panic!("service {name}: unreadable port mapping {:?}", ports[0]));
        assert_eq!(
            mapping.container, CONTAINER_PORT,
            "service {name}: must publish container port {CONTAINER_PORT}"
        );
    }
    assert_eq!(
        compose_ports(&services),
        HOST_PORTS,
        "docker-compose.yml: host ports"
    );
    // Redlock's votes must come from independent masters: no node may
    // replicate another (`slaveof` is the old spelling).
    for line in content_lines(&text) {
        let lower = line.to_ascii_lowercase();
        assert!(
            !lower.contains("replicaof") && !lower.contains("slaveof"),
            "docker-compose.yml configures replication: {line:?}"
        );
    }
}

#[test]
fn readme_node_list_matches_compose() {
    let services = parse_services(&read("docker-compose.yml"));
    let readme = read("README.md");
    let list = readme
        .lines()
        .find_map(|line| line.split_once("REDFENCE_NODES=").map(|(_, rest)| rest))
        .expect("README.md has no `REDFENCE_NODES=` line");
    let list = list
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .trim_matches(|c| c == '"' || c == '\'');
    let mut readme_ports = Vec::new();
    for url in list.split(',') {
        let (host, port) = url
            .strip_prefix("redis://")
            .and_then(|rest| rest.rsplit_once(':'))
            .unwrap_or_else(|| panic!("README.md: {url:?} is not redis://host:port"));
        assert!(
            host == "127.0.0.1" || host == "localhost",
            "README.md: {url:?} does not point at this machine, where compose publishes"
        );
        let port: u16 = port
            .parse()
            .unwrap_or_else(|_| panic!("README.md: bad port in {url:?}"));
        readme_ports.push(port);
    }
    assert_eq!(
        readme_ports,
        compose_ports(&services),
        "REDFENCE_NODES in README.md lists other ports than docker-compose.yml publishes"
    );
}

/// The reader itself, on the shapes compose allows besides the one in use,
/// so that a rewrite of the file into another style keeps being checked.
#[test]
fn reader_understands_other_compose_styles() {
    let text = "\
# comment
services:
  a:
    image: \"redis:7.2\"
    command: redis-server --appendonly yes   # trailing comment
    ports:
      - 7001:6379
  b:
    image: redis:7
    command:
      - redis-server
      - --appendfsync
      - always
    ports: [\"127.0.0.1:7002:6379/tcp\"]
volumes:
  data:
";
    let services = parse_services(text);
    assert_eq!(services.len(), 2);
    let a = &services["a"];
    assert_eq!(a.scalar("image"), Some("redis:7.2".into()));
    assert_eq!(a.words("command"), ["redis-server", "--appendonly", "yes"]);
    assert_eq!(parse_port(&a.list("ports")[0]).map(|p| p.host), Some(7001));
    let b = &services["b"];
    assert_eq!(
        b.words("command"),
        ["redis-server", "--appendfsync", "always"]
    );
    let port = parse_port(&b.list("ports")[0]).unwrap();
    assert_eq!((port.host, port.container), (7002, 6379));
}

fn read(file: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// One service: its keys, each with the raw inline value and any block-list
/// items below it.
#[derive(Debug, Default)]
struct Service {
    keys: BTreeMap<String, Entry>,
}

#[derive(Debug, Default)]
struct Entry {
    inline: String,
    items: Vec<String>,
}

impl Service {
    fn scalar(&self, key: &str) -> Option<String> {
        self.keys.get(key).map(|e| unquote(&e.inline).to_owned())
    }

    /// A list given as block items, a flow list `[a, b]`, or one scalar.
    fn list(&self, key: &str) -> Vec<String> {
        let Some(entry) = self.keys.get(key) else {
            return Vec::new();
        };
        if !entry.items.is_empty() {
            return entry.items.iter().map(|i| unquote(i).to_owned()).collect();
        }
        let inline = entry.inline.trim();
        match inline.strip_prefix('[').and_then(|s| s.strip_suffix(']')) {
            Some(flow) => flow
                .split(',')
                .map(|i| unquote(i).to_owned())
                .filter(|i| !i.is_empty())
                .collect(),
            None if inline.is_empty() => Vec::new(),
            None => vec![unquote(inline).to_owned()],
        }
    }

    /// A command in any of the list forms, or as one shell-like string,
    /// split into words.
    fn words(&self, key: &str) -> Vec<String> {
        self.list(key)
            .iter()
            .flat_map(|item| item.split_whitespace().map(str::to_owned))
            .collect()
    }
}

/// Services by name, from the `services:` section. Panics on lines it cannot
/// place, so an unexpected layout fails loudly.
fn parse_services(text: &str) -> BTreeMap<String, Service> {
    let mut services = BTreeMap::new();
    let mut in_services = false;
    let mut service: Option<String> = None;
    let mut key: Option<String> = None;
    for line in content_lines(text) {
        let indent = line.len() - line.trim_start().len();
        let content = line.trim();
        if indent == 0 {
            in_services = content == "services:";
            service = None;
            key = None;
            continue;
        }
        if !in_services {
            continue;
        }
        if indent == 2 {
            let name = content
                .strip_suffix(':')
                .unwrap_or_else(|| panic!("expected a service name, found {line:?}"));
            services.insert(name.to_owned(), Service::default());
            service = Some(name.to_owned());
            key = None;
            continue;
        }
        let current = service
            .as_ref()
            .and_then(|s| services.get_mut(s))
            .unwrap_or_else(|| panic!("line outside any service: {line:?}"));
        if let Some(item) = content.strip_prefix("- ") {
            let entry = key
                .as_ref()
                .and_then(|k| current.keys.get_mut(k))
                .unwrap_or_else(|| panic!("list item outside any key: {line:?}"));
            entry.items.push(item.trim().to_owned());
        } else if indent == 4 {
            let (k, v) = content
                .split_once(':')
                .unwrap_or_else(|| panic!("expected `key: value`, found {line:?}"));
            current.keys.insert(
                k.trim().to_owned(),
                Entry {
                    inline: v.trim().to_owned(),
                    items: Vec::new(),
                },
            );
            key = Some(k.trim().to_owned());
        }
        // Deeper mappings (e.g. healthcheck options) are not checked.
    }
    services
}

/// Non-blank lines with comments removed. A `#` starts a comment at the line
/// start or after whitespace, as in YAML (none of the checked values
/// contains one).
fn content_lines(text: &str) -> impl Iterator<Item = &str> {
    text.lines()
        .map(|line| {
            let cut = line
                .char_indices()
                .find(|&(i, c)| c == '#' && (i == 0 || line[..i].ends_with(char::is_whitespace)))
                .map_or(line.len(), |(i, _)| i);
            line[..cut].trim_end()
        })
        .filter(|line| !line.trim().is_empty())
}

fn unquote(s: &str) -> &str {
    s.trim().trim_matches(|c| c == '"' || c == '\'')
}

struct PortMapping {
    host: u16,
    container: u16,
}

/// `[ip:]host:container[/proto]`.
fn parse_port(spec: &str) -> Option<PortMapping> {
    let spec = spec.split('/').next()?;
    let mut parts = spec.rsplit(':');
    let container = parts.next()?.parse().ok()?;
    let host = parts.next()?.parse().ok()?;
    Some(PortMapping { host, container })
}

/// Published host ports, ascending.
fn compose_ports(services: &BTreeMap<String, Service>) -> Vec<u16> {
    let mut ports: Vec<u16> = services
        .values()
        .filter_map(|s| s.list("ports").first().and_then(|p| parse_port(p)))
        .map(|p| p.host)
        .collect();
    ports.sort_unstable();
    ports
}
