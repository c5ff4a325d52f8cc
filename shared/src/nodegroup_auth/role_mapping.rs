//! `mapRoles` of `aws-auth`: read it as the authenticator does, decide the one change a node
//! role needs, and write it back without disturbing anything else.
//!
//! The authenticator (aws-iam-authenticator `ParseMap`) converts the string from YAML to JSON
//! (`sigs.k8s.io/yaml`: go-yaml reads the *first* document only into a Go map, so a key that
//! appears twice keeps its last value, and the JSON encoder writes a map's keys in byte-wise
//! sorted order) and decodes that JSON with Go's `encoding/json`: JSON flow style is YAML too,
//! field names match case-insensitively in Go's folding (so of `UserName` and `username` the
//! spelling that sorts last, `username`, wins: its value is assigned last), unknown fields are
//! ignored, a value of the wrong type fails the whole string, and mappings are keyed by the
//! lower-cased role ARN so the last duplicate item wins. A string that is empty, ``` `` ```
//! or `""` is skipped. [`effective_fields`] is that key resolution, in one place.
//!
//! Writing keeps the user's text whenever possible: a new mapping is appended to a block
//! list as text, so comments, quoting and key order of every other entry stay exactly as
//! they were. Any other change re-renders the list from the parsed items (fields in their
//! original order, unknown fields kept). Whatever the path, the result is parsed again and
//! must decode to exactly the intended mappings, or nothing is written.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

/// The username every node role maps to; the authenticator fills in the instance's name.
pub const NODE_USERNAME: &str = "system:node:{{EC2PrivateDNSName}}";
pub(crate) const BOOTSTRAPPERS_GROUP: &str = "system:bootstrappers";
pub(crate) const NODES_GROUP: &str = "system:nodes";
/// Windows nodes need it for kube-proxy (EKS's own mapping for Windows node groups).
pub(crate) const KUBE_PROXY_WINDOWS_GROUP: &str = "eks:kube-proxy-windows";

/// The only groups this function ever writes. Nothing from an event can add to it.
pub const ALLOWED_NODE_GROUPS: [&str; 3] =
    [BOOTSTRAPPERS_GROUP, NODES_GROUP, KUBE_PROXY_WINDOWS_GROUP];

/// The operating system family of a node group, from its `amiType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeOs {
    Linux,
    Windows,
}

impl NodeOs {
    /// `WINDOWS_*` AMI types are Windows; everything else (including `CUSTOM`) is Linux.
    pub fn from_ami_type(ami_type: &str) -> Self {
        if ami_type.starts_with("WINDOWS_") {
            Self::Windows
        } else {
            Self::Linux
        }
    }

    /// The groups a node role of this OS needs.
    pub fn required_groups(self) -> &'static [&'static str] {
        match self {
            Self::Linux => &ALLOWED_NODE_GROUPS[..2],
            Self::Windows => &ALLOWED_NODE_GROUPS,
        }
    }
}

/// Why `mapRoles` cannot be used or written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MapRolesError {
    #[error(
        "aws-auth mapRoles cannot be parsed ({0}); the authenticator cannot read it either: fix the ConfigMap by hand, nothing was written"
    )]
    Malformed(String),
    #[error(
        "aws-auth mapRoles item {index} is invalid: {problem}; fix the ConfigMap by hand, nothing was written"
    )]
    InvalidItem { index: usize, problem: String },
    #[error(
        "the rendered mapRoles would not grant exactly the intended change ({0}); nothing was written"
    )]
    Verification(String),
}

/// One item of `mapRoles` as written: its fields in order, values untouched.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MapRolesItem {
    fields: Vec<(String, Value)>,
}

impl MapRolesItem {
    fn node_mapping(role_arn: &str, groups: &[&str]) -> Self {
        Self {
            fields: vec![
                ("rolearn".to_owned(), Value::String(role_arn.to_owned())),
                (
                    "username".to_owned(),
                    Value::String(NODE_USERNAME.to_owned()),
                ),
                (
                    "groups".to_owned(),
                    Value::Array(
                        groups
                            .iter()
                            .map(|g| Value::String((*g).to_owned()))
                            .collect(),
                    ),
                ),
            ],
        }
    }

    /// Adds `groups` to the field the authenticator reads as `groups`.
    fn add_groups(&mut self, groups: &[String]) {
        let index = effective_fields(&self.fields)
            .into_iter()
            .rev()
            .find(|(folded, _)| folded == "GROUPS")
            .map(|(_, index)| index);
        let field = index.and_then(|i| self.fields.get_mut(i));
        let new = groups.iter().cloned().map(Value::String);
        match field {
            Some((_, Value::Array(existing))) => existing.extend(new),
            Some((_, value)) => *value = Value::Array(new.collect()),
            None => self
                .fields
                .push(("groups".to_owned(), Value::Array(new.collect()))),
        }
    }
}

impl Serialize for MapRolesItem {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.fields.len()))?;
        for (key, value) in &self.fields {
            map.serialize_entry(key, value)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for MapRolesItem {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ItemVisitor;
        impl<'de> Visitor<'de> for ItemVisitor {
            type Value = MapRolesItem;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a mapping with rolearn, username and groups")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<MapRolesItem, A::Error> {
                let mut fields = Vec::new();
                while let Some((key, value)) = map.next_entry::<String, Value>()? {
                    fields.push((key, value));
                }
                Ok(MapRolesItem { fields })
            }
        }
        deserializer.deserialize_map(ItemVisitor)
    }
}

/// What the authenticator reads from one item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoleMapping {
    pub role_arn: String,
    pub username: String,
    pub groups: Vec<String>,
    /// Every other field (`sso`, `userid`, unknown ones), by lower-cased name.
    pub other: BTreeMap<String, Value>,
}

impl RoleMapping {
    fn from_item(index: usize, item: &MapRolesItem) -> Result<Self, MapRolesError> {
        let invalid = |problem: String| MapRolesError::InvalidItem { index, problem };
        let mut mapping = RoleMapping {
            role_arn: String::new(),
            username: String::new(),
            groups: Vec::new(),
            other: BTreeMap::new(),
        };
        // Go's decoder assigns the fields in the JSON's (sorted) key order: the spelling
        // that sorts last is assigned last and wins.
        for (folded, position) in effective_fields(&item.fields) {
            let (key, value) = &item.fields[position];
            match folded.to_ascii_lowercase().as_str() {
                "rolearn" => mapping.role_arn = string_field(key, value).map_err(invalid)?,
                "username" => mapping.username = string_field(key, value).map_err(invalid)?,
                "groups" => {
                    mapping.groups = match value {
                        Value::Null => Vec::new(),
                        Value::Array(items) => items
                            .iter()
                            .map(|g| string_field(key, g))
                            .collect::<Result<_, _>>()
                            .map_err(invalid)?,
                        _ => return Err(invalid(format!("{key} must be a list of strings"))),
                    }
                }
                other => {
                    mapping.other.insert(other.to_owned(), value.clone());
                }
            }
        }
        Ok(mapping)
    }

    /// The key the authenticator files this mapping under.
    fn key(&self) -> String {
        self.role_arn.to_lowercase()
    }

    /// A mapping this function could have written: the node username, only node groups,
    /// nothing else.
    pub fn is_node_shaped(&self) -> bool {
        self.username == NODE_USERNAME
            && self
                .groups
                .iter()
                .all(|g| ALLOWED_NODE_GROUPS.contains(&g.as_str()))
            && self.other.is_empty()
    }

    /// Groups that give more than a node needs: `system:masters` and any other `system:` or
    /// `eks:` group outside the three node groups.
    pub fn privileged_groups(&self) -> Vec<String> {
        self.groups
            .iter()
            .filter(|g| {
                !ALLOWED_NODE_GROUPS.contains(&g.as_str())
                    && (g.starts_with("system:") || g.starts_with("eks:"))
            })
            .cloned()
            .collect()
    }
}

/// The fields as Go's `encoding/json` assigns them after `sigs.k8s.io/yaml`: one entry per
/// distinct key (an exact duplicate keeps its last occurrence, as a Go map does), in byte-wise
/// key order (as the JSON encoder writes a map), each with its key folded the way the
/// decoder compares field names; returns `(folded key, index into fields)`.
pub(crate) fn effective_fields(fields: &[(String, Value)]) -> Vec<(String, usize)> {
    let mut last: BTreeMap<&str, usize> = BTreeMap::new();
    for (index, (key, _)) in fields.iter().enumerate() {
        last.insert(key.as_str(), index);
    }
    last.into_iter()
        .map(|(key, index)| (go_fold(key), index))
        .collect()
}

/// Go's `encoding/json` field-name folding (`foldName`: upper case of the lower case, per
/// character, simple mappings): ASCII letters fold to upper case, and so do the few
/// non-ASCII letters whose simple case mapping is an ASCII one (`ſ` long s, `K` Kelvin sign,
/// `ı` dotless i, `İ` dotted capital I), so `uſername` is `username` to the authenticator.
fn go_fold(key: &str) -> String {
    key.chars()
        .map(|c| match c {
            '\u{017F}' => 'S',
            '\u{212A}' => 'K',
            '\u{0131}' | '\u{0130}' => 'I',
            c if c.is_ascii() => c.to_ascii_uppercase(),
            c => {
                let mut lower = c.to_lowercase();
                match (lower.next(), lower.next()) {
                    (Some(l), None) => {
                        let mut upper = l.to_uppercase();
                        match (upper.next(), upper.next()) {
                            (Some(u), None) => u,
                            _ => l,
                        }
                    }
                    _ => c,
                }
            }
        })
        .collect()
}

fn string_field(key: &str, value: &Value) -> Result<String, String> {
    match value {
        Value::String(s) => Ok(s.clone()),
        Value::Null => Ok(String::new()),
        _ => Err(format!("{key} must be a string, found {value}")),
    }
}

/// How the existing text is laid out, which decides whether a new item can be appended.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Layout {
    /// Absent, or a value the authenticator skips.
    Empty,
    /// A block list whose items start with `{indent}- `.
    Block { indent: String },
    /// Flow (JSON) style or anything unusual: re-render.
    Other,
}

/// An existing mapping for the role that this function must not touch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MappingConflict {
    /// Position in `mapRoles` (0-based).
    pub index: usize,
    pub role_arn: String,
    pub username: String,
    pub groups: Vec<String>,
    pub reason: ConflictReason,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConflictReason {
    /// Maps the role to a user other than the node user.
    ForeignUsername,
    /// Grants groups beyond a node's.
    PrivilegedGroups(Vec<String>),
    /// On removal: the entry carries more than a node mapping (extra groups or fields).
    NotNodeShaped,
}

impl fmt::Display for MappingConflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let why = match &self.reason {
            ConflictReason::ForeignUsername => {
                format!(
                    "it maps the role to username {:?}, not the node username",
                    self.username
                )
            }
            ConflictReason::PrivilegedGroups(groups) => {
                format!("it grants privileged groups {groups:?}")
            }
            ConflictReason::NotNodeShaped => {
                "it carries more than a node mapping (extra groups or fields)".to_owned()
            }
        };
        write!(
            f,
            "mapRoles item {} for {} was left untouched: {why}",
            self.index, self.role_arn
        )
    }
}

/// The one change a node role needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MappingChange {
    /// Append a new node mapping for the role.
    Append {
        role_arn: String,
        groups: Vec<String>,
    },
    /// Add missing node groups to the role's existing node mapping.
    AddGroups { index: usize, groups: Vec<String> },
    /// Remove the role's node mappings (every duplicate, all node-shaped).
    Remove { indices: Vec<usize> },
}

/// What granting a role needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GrantDecision {
    AlreadyGranted,
    Change(MappingChange),
    Conflict(MappingConflict),
}

/// What revoking a role needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RevokeDecision {
    NotPresent,
    Change(MappingChange),
    Conflict(MappingConflict),
}

/// A parsed `mapRoles` value.
#[derive(Debug, Clone)]
pub struct MapRoles {
    source: String,
    layout: Layout,
    items: Vec<MapRolesItem>,
    mappings: Vec<RoleMapping>,
}

impl MapRoles {
    /// Parses `mapRoles` (`None` when the key is absent).
    pub fn parse(source: Option<&str>) -> Result<Self, MapRolesError> {
        let source = source.unwrap_or_default();
        let (items, several_documents) = parse_items(source)?;
        let mappings = items
            .iter()
            .enumerate()
            .map(|(index, item)| RoleMapping::from_item(index, item))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            source: source.to_owned(),
            layout: layout_of(source, several_documents),
            items,
            mappings,
        })
    }

    pub fn mappings(&self) -> &[RoleMapping] {
        &self.mappings
    }

    /// The mapping the authenticator uses for `role_arn` (the last one, case-insensitive).
    pub fn effective(&self, role_arn: &str) -> Option<(usize, &RoleMapping)> {
        let key = role_arn.to_lowercase();
        self.mappings
            .iter()
            .enumerate()
            .rev()
            .find(|(_, m)| m.key() == key)
    }

    /// What it takes for `role_arn` (path already stripped) to hold `required` groups.
    pub fn grant(&self, role_arn: &str, required: &[&str]) -> GrantDecision {
        let Some((index, mapping)) = self.effective(role_arn) else {
            return GrantDecision::Change(MappingChange::Append {
                role_arn: role_arn.to_owned(),
                groups: required.iter().map(|g| (*g).to_owned()).collect(),
            });
        };
        let conflict = |reason| {
            GrantDecision::Conflict(MappingConflict {
                index,
                role_arn: mapping.role_arn.clone(),
                username: mapping.username.clone(),
                groups: mapping.groups.clone(),
                reason,
            })
        };
        if mapping.username != NODE_USERNAME {
            return conflict(ConflictReason::ForeignUsername);
        }
        let privileged = mapping.privileged_groups();
        if !privileged.is_empty() {
            return conflict(ConflictReason::PrivilegedGroups(privileged));
        }
        let missing: Vec<String> = required
            .iter()
            .filter(|g| !mapping.groups.iter().any(|have| have == *g))
            .map(|g| (*g).to_owned())
            .collect();
        if missing.is_empty() {
            GrantDecision::AlreadyGranted
        } else {
            GrantDecision::Change(MappingChange::AddGroups {
                index,
                groups: missing,
            })
        }
    }

    /// What it takes to remove `role_arn`'s node mapping. Every entry for the role must be
    /// node-shaped: removing only the last of several would promote an earlier one.
    pub fn revoke(&self, role_arn: &str) -> RevokeDecision {
        let key = role_arn.to_lowercase();
        let indices: Vec<usize> = self
            .mappings
            .iter()
            .enumerate()
            .filter(|(_, m)| m.key() == key)
            .map(|(i, _)| i)
            .collect();
        if indices.is_empty() {
            return RevokeDecision::NotPresent;
        }
        if let Some(&index) = indices
            .iter()
            .find(|&&i| !self.mappings[i].is_node_shaped())
        {
            let mapping = &self.mappings[index];
            let reason = if mapping.username != NODE_USERNAME {
                ConflictReason::ForeignUsername
            } else if !mapping.privileged_groups().is_empty() {
                ConflictReason::PrivilegedGroups(mapping.privileged_groups())
            } else {
                ConflictReason::NotNodeShaped
            };
            return RevokeDecision::Conflict(MappingConflict {
                index,
                role_arn: mapping.role_arn.clone(),
                username: mapping.username.clone(),
                groups: mapping.groups.clone(),
                reason,
            });
        }
        RevokeDecision::Change(MappingChange::Remove { indices })
    }

    /// The new `mapRoles` text with `change` applied, verified by parsing it again.
    pub fn render(&self, change: &MappingChange) -> Result<String, MapRolesError> {
        let expected = self.expected_mappings(change);
        let mut last_problem = String::new();
        for candidate in [
            self.render_as_text_edit(change),
            Some(self.render_items(change)?),
        ]
        .into_iter()
        .flatten()
        {
            match MapRoles::parse(Some(&candidate)) {
                Ok(parsed) if parsed.mappings == expected => return Ok(candidate),
                Ok(_) => last_problem = "it decodes to different mappings".to_owned(),
                Err(err) => last_problem = err.to_string(),
            }
        }
        Err(MapRolesError::Verification(last_problem))
    }

    /// The mappings the authenticator must see after `change`: computed on the decoded
    /// mappings, independently of any rendering.
    fn expected_mappings(&self, change: &MappingChange) -> Vec<RoleMapping> {
        let mut mappings = self.mappings.clone();
        match change {
            MappingChange::Append { role_arn, groups } => mappings.push(RoleMapping {
                role_arn: role_arn.clone(),
                username: NODE_USERNAME.to_owned(),
                groups: groups.clone(),
                other: BTreeMap::new(),
            }),
            MappingChange::AddGroups { index, groups } => {
                if let Some(mapping) = mappings.get_mut(*index) {
                    mapping.groups.extend(groups.iter().cloned());
                }
            }
            MappingChange::Remove { indices } => {
                let mut i = 0;
                mappings.retain(|_| {
                    let keep = !indices.contains(&i);
                    i += 1;
                    keep
                });
            }
        }
        mappings
    }

    /// Appending to, or cutting items out of, a block list keeps the user's text byte for
    /// byte everywhere else.
    fn render_as_text_edit(&self, change: &MappingChange) -> Option<String> {
        let (role_arn, groups) = match change {
            MappingChange::Append { role_arn, groups } => (role_arn, groups),
            MappingChange::Remove { indices } => return self.remove_as_text_edit(indices),
            MappingChange::AddGroups { .. } => return None,
        };
        let groups: Vec<&str> = groups.iter().map(String::as_str).collect();
        match &self.layout {
            Layout::Empty => Some(node_item_text("", role_arn, &groups)),
            Layout::Block { indent } => {
                let mut text = self.source.clone();
                if !text.ends_with('\n') {
                    text.push('\n');
                }
                text.push_str(&node_item_text(indent, role_arn, &groups));
                Some(text)
            }
            Layout::Other => None,
        }
    }

    /// Cuts the items' lines out of a block list. Each item runs from its `- ` line at the
    /// list's indentation to the next one; when the lines do not split into exactly one
    /// chunk per item (a block scalar that looks like an item, ...), give up.
    fn remove_as_text_edit(&self, indices: &[usize]) -> Option<String> {
        let Layout::Block { indent } = &self.layout else {
            return None;
        };
        let mut header = String::new();
        let mut chunks: Vec<String> = Vec::new();
        for line in self.source.split_inclusive('\n') {
            let starts_item = line
                .strip_prefix(indent.as_str())
                .and_then(|rest| rest.strip_prefix('-'))
                .is_some_and(|rest| rest.is_empty() || rest.starts_with([' ', '\n', '\r']));
            match chunks.last_mut() {
                _ if starts_item => chunks.push(line.to_owned()),
                Some(chunk) => chunk.push_str(line),
                None => header.push_str(line),
            }
        }
        if chunks.len() != self.items.len() {
            return None;
        }
        let kept: String = chunks
            .into_iter()
            .enumerate()
            .filter(|(i, _)| !indices.contains(i))
            .map(|(_, chunk)| chunk)
            .collect();
        Some(header + &kept)
    }

    /// The whole list rendered again from the parsed items (comments are lost).
    fn render_items(&self, change: &MappingChange) -> Result<String, MapRolesError> {
        let mut items = self.items.clone();
        match change {
            MappingChange::Append { role_arn, groups } => {
                let groups: Vec<&str> = groups.iter().map(String::as_str).collect();
                items.push(MapRolesItem::node_mapping(role_arn, &groups));
            }
            MappingChange::AddGroups { index, groups } => {
                if let Some(item) = items.get_mut(*index) {
                    item.add_groups(groups);
                }
            }
            MappingChange::Remove { indices } => {
                let mut i = 0;
                items.retain(|_| {
                    let keep = !indices.contains(&i);
                    i += 1;
                    keep
                });
            }
        }
        if items.is_empty() {
            return Ok(String::new());
        }
        let options = serde_saphyr::ser_options! {
            prefer_block_scalars: false,
            compact_list_indent: false,
        };
        serde_saphyr::to_string_with_options(&items, options)
            .map_err(|err| MapRolesError::Verification(format!("cannot render YAML: {err}")))
    }
}

/// The node mapping as eksctl and EKS write it, at `indent`.
fn node_item_text(indent: &str, role_arn: &str, groups: &[&str]) -> String {
    let mut text = format!(
        "{indent}- rolearn: {role_arn}\n{indent}  username: {NODE_USERNAME}\n{indent}  groups:\n"
    );
    for group in groups {
        text.push_str(&format!("{indent}    - {group}\n"));
    }
    text
}

/// Whether the authenticator skips the value (`isSkippable`).
fn is_skippable(source: &str) -> bool {
    matches!(source.trim(), "" | "``" | "\"\"")
}

/// The items of the first document, and whether other documents follow it.
fn parse_items(source: &str) -> Result<(Vec<MapRolesItem>, bool), MapRolesError> {
    if is_skippable(source) {
        return Ok((Vec::new(), false));
    }
    let (first, several_documents) = first_document(source);
    // Duplicate keys reach the item (the authenticator keeps the last; see
    // `effective_fields`).
    let options = serde_saphyr::options! {
        with_snippet: false,
        duplicate_keys: serde_saphyr::DuplicateKeyPolicy::PassThrough,
    };
    serde_saphyr::from_str_with_options::<Option<Vec<MapRolesItem>>>(&first, options)
        .map(|items| (items.unwrap_or_default(), several_documents))
        .map_err(|err| MapRolesError::Malformed(first_line(&err.to_string())))
}

/// The text of the first YAML document, and whether anything follows it. go-yaml reads the
/// first document and never looks further, so a second one (even one that is not YAML at
/// all) changes nothing for the authenticator. A document ends at a line that starts with a
/// `---` or `...` marker (in YAML a marker at column 0 ends the document wherever it stands);
/// a leading `---` only opens the first one.
fn first_document(source: &str) -> (String, bool) {
    let marker = |line: &str, marker: &str| {
        line.strip_prefix(marker)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with(char::is_whitespace))
    };
    let mut first = String::new();
    let mut opened = false;
    let mut lines = source.split_inclusive('\n');
    for line in lines.by_ref() {
        let trimmed = line.trim();
        if !opened && (trimmed.is_empty() || trimmed.starts_with('#') || line.starts_with('%')) {
            if !line.starts_with('%') {
                first.push_str(line);
            }
            continue;
        }
        if !opened && marker(line, "---") {
            opened = true;
            first.push_str(line[3..].trim_start_matches([' ', '\t']));
            continue;
        }
        if opened && (marker(line, "---") || marker(line, "...")) {
            let rest_has_content = lines.any(|l| {
                let t = l.trim();
                !t.is_empty() && !t.starts_with('#') && !marker(l, "...")
            });
            return (first, rest_has_content || marker(line, "---"));
        }
        opened = true;
        first.push_str(line);
    }
    (first, false)
}

fn first_line(message: &str) -> String {
    message.lines().next().unwrap_or_default().to_owned()
}

fn layout_of(source: &str, several_documents: bool) -> Layout {
    if is_skippable(source) {
        return Layout::Empty;
    }
    // Appending text would land in the last document, which the authenticator never reads.
    if several_documents {
        return Layout::Other;
    }
    let first = source
        .lines()
        .find(|line| !line.trim().is_empty() && !line.trim_start().starts_with('#'));
    match first {
        Some(line) => {
            let trimmed = line.trim_start();
            let indent = &line[..line.len() - trimmed.len()];
            if (trimmed.starts_with("- ") || trimmed == "-") && !indent.contains('\t') {
                Layout::Block {
                    indent: indent.to_owned(),
                }
            } else {
                Layout::Other
            }
        }
        None => Layout::Other,
    }
}
