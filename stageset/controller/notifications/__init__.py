"""Notifications: StageSet events sent to webhooks, Slack, Microsoft Teams and commit statuses,
configured by platform-owned ``NotificationProvider``/``NotificationAlert`` objects
(docs/notifications.md).

- :mod:`.payloads`: what each provider type is sent (pure);
- :mod:`.config`: the configuration read from the notification namespace, and matching;
- :mod:`.delivery`: bounded, rate-limited, retrying per-provider outboxes;
- :mod:`.notifier`: the recorder's listener that ties them together.
"""
