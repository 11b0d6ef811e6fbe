# Prints `NAME reached` or `NAME blocked` for each registry named: the only outside hosts the
# egress scenarios touch (any HTTP answer is "reached"; no answer within 20 s is "blocked").
for name in "$@"; do
  case $name in
    pypi) url=https://pypi.org/simple/six/ ;;
    pythonhosted) url=https://files.pythonhosted.org/ ;;
    npm) url=https://registry.npmjs.org/is-number ;;
    apt) url=http://deb.debian.org/debian/dists/bookworm/Release ;;
    *) echo "reach.sh: unknown name $name" >&2; exit 2 ;;
  esac
  code=$(curl -s -o /dev/null --connect-timeout 5 -m 20 -w '%{http_code}' "$url")
  case $code in
    000 | "") echo "$name blocked" ;;
    *) echo "$name reached" ;;
  esac
done
