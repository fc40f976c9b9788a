"""The settings of the daemon's fronts: where the HTTP API and the E2B front listen, and what
the E2B front serves (a group of :class:`sandboxd.config.Config`)."""

from attrs import frozen

from sandboxd.listen import DUAL_STACK_MODES
from sandboxd.settings import choice, flag, nonempty_text, optional_text, setting_field

BUILD_NETWORKS = ("none", "host")


@frozen(slots=False)  # (a base of Config, whose own slots hold every setting)
class FrontSettings:
    """Where the fronts listen, who may call them, and the E2B front's own settings."""

    listen: str = setting_field(
        "SANDBOXD_LISTEN",
        None,
        nonempty_text,
        "Twisted endpoint string to listen on (default: tcp:8080 with a token, else"
        " tcp:8080:interface=127.0.0.1)",
    )
    dual_stack: str = setting_field(
        "SANDBOXD_DUAL_STACK",
        "on",
        choice(DUAL_STACK_MODES),
        "Claim a tcp: port on IPv4 and IPv6 alike (on), or listen as the endpoint says (off)",
    )
    insecure: bool = setting_field(
        "SANDBOXD_INSECURE",
        "no",
        flag,
        "Allow listening beyond loopback with no token (anyone reaching the port runs code)",
        flag=True,
    )
    e2b_listen: str | None = setting_field(
        "SANDBOXD_E2B_LISTEN",
        None,
        optional_text,
        "Twisted endpoint string of the E2B-compatible front (default: off)",
    )
    e2b_domain: str | None = setting_field(
        "SANDBOXD_E2B_DOMAIN",
        None,
        optional_text,
        "Domain of the E2B front's port hosts, {port}-{sandbox_id}.DOMAIN (default: off)",
    )
    build_network: str = setting_field(
        "SANDBOXD_BUILD_NETWORK",
        "none",
        choice(BUILD_NETWORKS),
        "Network of a template build's RUN steps when the build names none (E2B's never do):"
        " none, or host (apt-get, pip install)",
    )
    pod_url: str | None = setting_field(
        "SANDBOXD_POD_URL",
        None,
        optional_text,
        "This replica's own URL (default: from POD_IP and the port)",
    )
