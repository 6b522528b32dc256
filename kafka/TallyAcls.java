// kafka/TallyAcls.java — the ACLs scripts/kafka gives a new cluster, created in one JVM
// (kafka-acls.sh would start one JVM per command: seconds each on a loaded test machine).
// scripts/lib.sh compiles it once into the jar cache and runs it as the cluster's admin.
//
//   java TallyAcls BOOTSTRAP ADMIN_PROPERTIES < ACLS
//
// ACLS: one ALLOW ACL a line, "principal operation resource-type pattern-type name",
// e.g. "User:aggregator Read Topic Literal usage" (any case). It only adds; it never removes.
import java.io.BufferedReader;
import java.io.FileReader;
import java.io.InputStreamReader;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.common.acl.AccessControlEntry;
import org.apache.kafka.common.acl.AclBinding;
import org.apache.kafka.common.acl.AclOperation;
import org.apache.kafka.common.acl.AclPermissionType;
import org.apache.kafka.common.resource.PatternType;
import org.apache.kafka.common.resource.ResourcePattern;
import org.apache.kafka.common.resource.ResourceType;

public class TallyAcls {
    public static void main(String[] args) throws Exception {
        if (args.length != 2) {
            System.err.println("usage: TallyAcls BOOTSTRAP ADMIN_PROPERTIES < ACLS");
            System.exit(2);
        }
        Properties props = new Properties();
        try (FileReader r = new FileReader(args[1])) {
            props.load(r);
        }
        props.put("bootstrap.servers", args[0]);
        List<AclBinding> acls = new ArrayList<>();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        for (String line; (line = in.readLine()) != null;) {
            line = line.trim();
            if (line.isEmpty())
                continue;
            String[] f = line.split("\\s+");
            for (int i = 1; i < 4 && i < f.length; i++)
                f[i] = f[i].toUpperCase(java.util.Locale.ROOT);
            AclOperation op = f.length == 5 ? AclOperation.fromString(f[1]) : AclOperation.UNKNOWN;
            ResourceType type = f.length == 5 ? ResourceType.fromString(f[2]) : ResourceType.UNKNOWN;
            PatternType pattern = f.length == 5 ? PatternType.fromString(f[3]) : PatternType.UNKNOWN;
            if (op == AclOperation.UNKNOWN || type == ResourceType.UNKNOWN || pattern == PatternType.UNKNOWN) {
                System.err.println("TallyAcls: bad ACL line: " + line);
                System.exit(2);
            }
            acls.add(new AclBinding(new ResourcePattern(type, f[4], pattern),
                    new AccessControlEntry(f[0], "*", op, AclPermissionType.ALLOW)));
        }
        try (Admin admin = Admin.create(props)) {
            admin.createAcls(acls).all().get();
        }
        System.err.println("TallyAcls: " + acls.size() + " ACLs created");
    }
}
