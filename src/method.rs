//! The one list of methods the gateway knows, and the rules that hang on them.
//!
//! A request's method is parsed once into a [`Method`]; the router dispatches on it, the
//! metrics label by it, telemetry names spans by it and the era rules (which methods a
//! 2026-07-28 client may send, which results carry cache hints, which may come back as
//! `input_required`) are methods of it. A name the gateway does not know is
//! [`Method::Other`]: forwarded nowhere, counted as `other`, answered with -32601.

/// A method a client may send the gateway (requests and the notifications it acts on).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Method {
    Initialize,
    Ping,
    ServerDiscover,
    ToolsList,
    ToolsCall,
    PromptsList,
    PromptsGet,
    ResourcesList,
    ResourcesTemplatesList,
    ResourcesRead,
    ResourcesSubscribe,
    ResourcesUnsubscribe,
    SubscriptionsListen,
    LoggingSetLevel,
    CompletionComplete,
    TasksGet,
    TasksResult,
    TasksCancel,
    TasksList,
    /// `notifications/initialized`
    Initialized,
    /// `notifications/cancelled`
    Cancelled,
    /// `notifications/progress`
    Progress,
    /// `notifications/roots/list_changed`
    RootsListChanged,
    /// Any other name: the request keeps its text for the error that names it.
    Other,
}

use Method::*;

/// Every known method with its name, in one table, in the order of the enum (so
/// [`Method::as_str`] is an index; checked at compile time below).
const NAMES: &[(Method, &str)] = &[
    (Initialize, "initialize"),
    (Ping, "ping"),
    (ServerDiscover, "server/discover"),
    (ToolsList, "tools/list"),
    (ToolsCall, "tools/call"),
    (PromptsList, "prompts/list"),
    (PromptsGet, "prompts/get"),
    (ResourcesList, "resources/list"),
    (ResourcesTemplatesList, "resources/templates/list"),
    (ResourcesRead, "resources/read"),
    (ResourcesSubscribe, "resources/subscribe"),
    (ResourcesUnsubscribe, "resources/unsubscribe"),
    (SubscriptionsListen, "subscriptions/listen"),
    (LoggingSetLevel, "logging/setLevel"),
    (CompletionComplete, "completion/complete"),
    (TasksGet, "tasks/get"),
    (TasksResult, "tasks/result"),
    (TasksCancel, "tasks/cancel"),
    (TasksList, "tasks/list"),
    (Initialized, "notifications/initialized"),
    (Cancelled, "notifications/cancelled"),
    (Progress, "notifications/progress"),
    (RootsListChanged, "notifications/roots/list_changed"),
];

const _: () = {
    let mut i = 0;
    while i < NAMES.len() {
        assert!(NAMES[i].0 as usize == i, "NAMES is not in the order of Method");
        i += 1;
    }
    assert!(Other as usize == NAMES.len(), "Other is not the last Method");
};

/// The list methods, in the order of `catalog::Lists::hints`.
pub const LISTS: [Method; 4] = [ToolsList, PromptsList, ResourcesList, ResourcesTemplatesList];

impl Method {
    /// The method named `name`, or [`Method::Other`].
    pub fn parse(name: &str) -> Method {
        // A match on the text: each arm compares lengths, and bytes only when they are
        // equal. The frequent names first.
        match name {
            "tools/call" => ToolsCall,
            "tools/list" => ToolsList,
            "ping" => Ping,
            "initialize" => Initialize,
            "server/discover" => ServerDiscover,
            "prompts/list" => PromptsList,
            "prompts/get" => PromptsGet,
            "resources/list" => ResourcesList,
            "resources/templates/list" => ResourcesTemplatesList,
            "resources/read" => ResourcesRead,
            "resources/subscribe" => ResourcesSubscribe,
            "resources/unsubscribe" => ResourcesUnsubscribe,
            "subscriptions/listen" => SubscriptionsListen,
            "logging/setLevel" => LoggingSetLevel,
            "completion/complete" => CompletionComplete,
            "tasks/get" => TasksGet,
            "tasks/result" => TasksResult,
            "tasks/cancel" => TasksCancel,
            "tasks/list" => TasksList,
            "notifications/initialized" => Initialized,
            "notifications/cancelled" => Cancelled,
            "notifications/progress" => Progress,
            "notifications/roots/list_changed" => RootsListChanged,
            _ => Other,
        }
    }

    /// The method's name on the wire; `other` for [`Method::Other`] (its metrics label).
    pub const fn as_str(self) -> &'static str {
        match self {
            Other => "other",
            m => NAMES[m as usize].1,
        }
    }

    /// Every known method (not [`Method::Other`]).
    pub fn all() -> impl Iterator<Item = Method> {
        NAMES.iter().map(|(m, _)| *m)
    }

    /// A request (as opposed to a notification the gateway acts on); [`Method::Other`] is
    /// one.
    pub const fn is_request(self) -> bool {
        !matches!(self, Initialized | Cancelled | Progress | RootsListChanged)
    }

    /// One of the four list methods the gateway answers from its catalog.
    pub fn is_list(self) -> bool {
        LISTS.contains(&self)
    }

    /// Served to a 2026-07-28 (stateless) client. The rest (the removed `initialize`,
    /// `ping`, `logging/setLevel`, `resources/(un)subscribe`, the tasks methods) is 404
    /// with -32601 there.
    pub fn is_stateless(self) -> bool {
        matches!(
            self,
            ServerDiscover
                | SubscriptionsListen
                | ToolsList
                | ToolsCall
                | PromptsList
                | PromptsGet
                | ResourcesList
                | ResourcesTemplatesList
                | ResourcesRead
                | CompletionComplete
        )
    }

    /// A 2026-07-28 result that carries `ttlMs` and `cacheScope`.
    pub fn is_cacheable(self) -> bool {
        matches!(self, ServerDiscover | ResourcesRead) || self.is_list()
    }

    /// May answer `input_required` (a server's question to the client, 2026-07-28), and so
    /// takes part in the rounds of questions and answers.
    pub fn may_ask(self) -> bool {
        matches!(self, ToolsCall | PromptsGet | ResourcesRead)
    }

    /// The params field that names what the request acts on (`Mcp-Name`, spans, routes).
    pub fn target_field(self) -> Option<&'static str> {
        match self {
            ToolsCall | PromptsGet => Some("name"),
            ResourcesRead | ResourcesSubscribe | ResourcesUnsubscribe => Some("uri"),
            _ => None,
        }
    }
}

impl From<&str> for Method {
    /// [`Method::parse`].
    fn from(name: &str) -> Method {
        Method::parse(name)
    }
}

impl std::fmt::Display for Method {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_is_other() {
        for m in Method::all() {
            assert_eq!(Method::parse(m.as_str()), m, "{m}");
        }
        assert_eq!(Method::all().count(), NAMES.len());
        assert_eq!(Method::parse("tools/Call"), Other);
        assert_eq!(Method::parse(""), Other);
        assert_eq!(Other.as_str(), "other");
    }

    #[test]
    fn era_rules() {
        assert!(ToolsCall.is_stateless() && !Ping.is_stateless() && !TasksGet.is_stateless());
        assert!(ResourcesRead.is_cacheable() && !ToolsCall.is_cacheable());
        assert!(ToolsCall.may_ask() && !ToolsList.may_ask());
        assert!(!Cancelled.is_request() && ToolsCall.is_request());
    }
}
