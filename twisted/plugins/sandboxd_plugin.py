from twisted.application.service import ServiceMaker

sandboxd = ServiceMaker(
    "sandboxd",
    "sandboxd.tap",
    "A sandbox host for AI-agent applications (see SANDBOXD_* settings).",
    "sandboxd",
)
