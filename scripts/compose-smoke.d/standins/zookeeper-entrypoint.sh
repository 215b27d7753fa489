#!/bin/bash
# As the official image: on start, zoo.cfg from the environment (one server, data in /data,
# clients on 2181, `srvr` allowed for the health check), then the command.
set -euo pipefail
cat > /etc/zookeeper/conf/zoo.cfg <<CFG
tickTime=${ZOO_TICK_TIME:-2000}
initLimit=${ZOO_INIT_LIMIT:-5}
syncLimit=${ZOO_SYNC_LIMIT:-2}
maxClientCnxns=${ZOO_MAX_CLIENT_CNXNS:-60}
dataDir=/data
dataLogDir=/datalog
clientPort=2181
4lw.commands.whitelist=srvr,ruok
CFG
export ZOO_LOG4J_PROP="INFO,CONSOLE"
exec "$@"
