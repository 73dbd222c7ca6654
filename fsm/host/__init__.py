"""Host loops: the drivers that carry out the core's actions on an injected clock (threads and
asyncio), the observer hook telemetry fills, turn recording, and scripted turns for tests.
"""
