#!/bin/sh
# Captures real iptables-save / ip6tables-save output after adding the
# rules berth's code reads (CNI bridge masquerade, portmap DNAT, CRIU's lock)
# in a throwaway network namespace. Usage, as root: capture.sh DIR
set -eu
ns=homescap$$
ip netns add $ns
trap 'ip netns del $ns' EXIT
add() { # program, pod address, subnet, multicast, host port, DNAT target
  ipt=$1 pod=$2 sub=$3 mc=$4 dport=$5 dest=$6
  tag="name: \"dual\" id: \"$ID\""
  ip netns exec $ns $ipt -w -t nat -N CNI-0a1b2c3d4e5f60718293a4b5
  ip netns exec $ns $ipt -w -t nat -A POSTROUTING -s $pod -m comment --comment "$tag" -j CNI-0a1b2c3d4e5f60718293a4b5
  ip netns exec $ns $ipt -w -t nat -A CNI-0a1b2c3d4e5f60718293a4b5 -d $sub -m comment --comment "$tag" -j ACCEPT
  ip netns exec $ns $ipt -w -t nat -A CNI-0a1b2c3d4e5f60718293a4b5 ! -d $mc -m comment --comment "$tag" -j MASQUERADE
  ip netns exec $ns $ipt -w -t nat -N CNI-HOSTPORT-DNAT
  ip netns exec $ns $ipt -w -t nat -A PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT
  ip netns exec $ns $ipt -w -t nat -N CNI-DN-0a1b2c3d4e5f60718293a
  ip netns exec $ns $ipt -w -t nat -A CNI-HOSTPORT-DNAT -p tcp -m comment --comment "dnat name: \"dual\" id: \"$ID\"" -m multiport --dports $dport -j CNI-DN-0a1b2c3d4e5f60718293a
  ip netns exec $ns $ipt -w -t nat -A CNI-DN-0a1b2c3d4e5f60718293a -p tcp -m tcp --dport $dport -j DNAT --to-destination $dest
  ip netns exec $ns $ipt -w -t nat -N BERTH-MASQ-bt7
  ip netns exec $ns $ipt -w -t nat -A POSTROUTING -s $sub -m comment --comment "berth default network bt7" -j BERTH-MASQ-bt7
  ip netns exec $ns $ipt -w -t nat -N CNI-empty0123456789abcdef
  ip netns exec $ns $ipt -w -t filter -N CRIU
  ip netns exec $ns $ipt -w -t filter -I INPUT -j CRIU
  ip netns exec $ns $ipt -w -t filter -I OUTPUT -j CRIU
  ip netns exec $ns $ipt -w -t filter -A CRIU -m mark --mark 0xc114 -j ACCEPT
  ip netns exec $ns $ipt -w -t filter -A CRIU -j DROP
  ip netns exec $ns $ipt -w -t filter -A INPUT -m comment --comment "reads like -j CRIU \"quoted\"" -j ACCEPT
  ip netns exec $ns $ipt -w -t filter -N BERTH-GOTO
  ip netns exec $ns $ipt -w -t filter -A FORWARD -i lo -g BERTH-GOTO
  ip netns exec $ns $ipt -w -t filter -A FORWARD -i lo
}
ID=4f1c0e9a8b7d6c5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e
add iptables 10.234.7.2/32 10.234.7.0/24 224.0.0.0/4 8080 10.234.7.2:80
add ip6tables fd00:b34:7::2/128 fd00:b34:7::/64 ff00::/8 8080 '[fd00:b34:7::2]:80'
out=$1
ip netns exec $ns iptables-save > $out/iptables-save.txt
ip netns exec $ns ip6tables-save > $out/ip6tables-save.txt
ip netns exec $ns ip6tables-save -t nat > $out/ip6tables-save-nat.txt
