#!/bin/bash
# code-interpreter-v1's start command (as root): the code interpreter on 49999 (as root, as
# the official template's) and agent-sandbox-server on 9000 (as `user`), each started again
# if it dies, as the official template's services are.
keep() {
  while true; do
    "$@"
    echo "start.sh: $* exited ($?), starting it again" >&2
    sleep 1
  done
}
keep /opt/abx/bin/python /opt/abx/interpreter/server.py &
keep runuser -u user -- /opt/abx/bin/agent-sandbox-server serve --port 9000 &
wait
