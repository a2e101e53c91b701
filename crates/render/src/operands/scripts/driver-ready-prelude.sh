until [ -f /run/nvidia/validations/driver-ready ]; do
  echo "waiting for /run/nvidia/validations/driver-ready"
  sleep 5
done

set -o allexport
cat /run/nvidia/validations/driver-ready
. /run/nvidia/validations/driver-ready
